"""Environments for the subprocesses tests start: minimal, reproducible, free of this machine's pip config.

This machine's pip configuration (``/etc/pip.conf``, ``/etc/xdg/pip/pip.conf``, ``~/.config/pip``)
and ``PIP_*`` variables add find-links, extra index URLs and constraints; a test pip must see none
of them, so every ``PIP_*`` variable is dropped and ``PIP_CONFIG_FILE=/dev/null`` is set (pip reads
no config file at all when that variable names ``os.devnull``).
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

#: Set in every environment handed to a test pip.
PIP_NEUTRAL = {
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_NO_INPUT": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}

#: Variables copied from the test runner's environment; everything else is left out so real CI
#: tokens never reach code under test.
PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "SYSTEMROOT")


def clean_env(home: Optional[os.PathLike] = None, extra: Optional[Mapping[str, str]] = None) -> dict:
    """Return a fresh environment: PATH/LANG from ours, ``HOME=home``, pip neutralised, plus ``extra``.

    ``home=None`` keeps no HOME at all (not the real one). ``extra`` values of ``None`` delete a key.
    """
    env = {k: os.environ[k] for k in PASSTHROUGH if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env.update(PIP_NEUTRAL)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if home is not None:
        home = os.fspath(home)
        env["HOME"] = home
        env["XDG_CONFIG_HOME"] = os.path.join(home, ".config")
        env["XDG_CACHE_HOME"] = os.path.join(home, ".cache")
        env["XDG_DATA_HOME"] = os.path.join(home, ".local", "share")
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env

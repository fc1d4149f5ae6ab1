"""The decoy credentials of the namespace backend: the tables, their planting, their watch.

The real homes' paths in the namespace are tmpfs holding a decoy for every credential
location of the rule table (:data:`DECOYS`); the run's own ``$HOME`` gets the ones no build
tool reads by itself (:data:`HOME_DECOYS`). :func:`plant_decoys` writes them (the plan, in
the run's ``$HOME``; pid 1, in each decoy home); :class:`DecoyWatch` reads, on the launcher's
side, the inotify fd pid 1 watches them with (made by
:func:`pipguard.sandbox.backends.ns.root._watch_decoys`).

Imports only the standard library and ``rules``: no kernel call through ``ctypes``, so the
plan can take the tables and plant them. Planting also runs in pid 1 after the fork: it
imports nothing there and writes only with ``os.write``.
"""

from __future__ import annotations

import os
import stat
import struct
import time
from typing import Dict, List, Mapping, Optional, Tuple

from pipguard import rules

#: inotify(7) mask bits of the decoy watch
IN_OPEN = 0x20
IN_ACCESS = 0x1
IN_ONLYDIR = 0x01000000
IN_CLOEXEC = os.O_CLOEXEC
IN_NONBLOCK = os.O_NONBLOCK

#: Decoy credentials. The run's own ``$HOME`` gets these: only files no build
#: tool reads by itself there (``~/.netrc``: meson and curl look it up;
#: ``~/.npmrc``: npm's config; ``~/.gnupg``: gpg verifying a signature), so
#: opening one is always a finding.
HOME_DECOYS: Dict[str, str] = {
    ".ssh/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\npipguard-decoy-{token}\n-----END OPENSSH PRIVATE KEY-----\n",
    ".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\npipguard-decoy-{token}\n-----END OPENSSH PRIVATE KEY-----\n",
    ".aws/credentials": "[default]\naws_access_key_id = AKIAPIPGUARDDECOY\naws_secret_access_key = pipguard-decoy-{token}\n",
    ".config/gh/hosts.yml": "github.com:\n    oauth_token: pipguard-decoy-{token}\n",
    ".git-credentials": "https://user:pipguard-decoy-{token}@github.com\n",
    ".pypirc": "[pypi]\nusername = __token__\npassword = pipguard-decoy-{token}\n",
    ".docker/config.json": '{{"auths": {{"registry.example": {{"auth": "pipguard-decoy-{token}"}}}}}}\n',
    ".kube/config": "users:\n- name: decoy\n  user:\n    token: pipguard-decoy-{token}\n",
    ".config/gcloud/application_default_credentials.json": '{{"refresh_token": "pipguard-decoy-{token}"}}\n',
    ".azure/msal_token_cache.json": '{{"AccessToken": "pipguard-decoy-{token}"}}\n',
}
#: Formats a stealer parses before it goes on (Firefox's profiles.ini names the profile
#: directory it then reads; Chrome's Local State holds the key of its Login Data).
_FORMATTED = {
    ".mozilla/firefox/profiles.ini": "[Profile0]\nName=default-release\nIsRelative=1\n"
                                     f"Path={rules.FIREFOX_PROFILE}\nDefault=1\n\n"
                                     "[General]\nStartWithLastProfile=1\nVersion=2\n",
    ".thunderbird/profiles.ini": "[Profile0]\nName=default-release\nIsRelative=1\n"
                                 f"Path={rules.FIREFOX_PROFILE}\nDefault=1\n",
    "Local State": '{{"os_crypt": {{"encrypted_key": "pipguard-decoy-{token}"}}}}\n',
}
_GENERIC = "pipguard-decoy-{token}\n"


def _decoy(rel: str) -> str:
    return _FORMATTED.get(rel) or _FORMATTED.get(rel.rsplit("/", 1)[-1]) or _GENERIC


#: The real homes' tmpfs (nothing but a thief opens a file at a real home's path: ``$HOME``
#: is the run's own) get a decoy for every file of the rule table's credential locations
#: (:func:`pipguard.rules.credential_files`: a store's usual files, generated there); each
#: store directory is watched too (listing it is opening it), by its first file's directory.
DECOY_DIRECTORIES: Dict[str, str] = {store: files[0]
                                     for store, files in rules.CREDENTIAL_STORE_FILES.items()}
DECOYS: Dict[str, str] = dict(HOME_DECOYS)
# a name a stealer tries that is no credential by the table (a name not planted fails with
# ENOENT: with read observation off, that attempt is not reported)
DECOYS[".docker/.token_seed"] = _GENERIC
for _rel in rules.credential_files():
    DECOYS.setdefault(_rel, _decoy(_rel))
# The run's own $HOME also gets the stores no build tool opens (browsers, wallets, keyrings):
# a $HOME-relative ``cat ~/.mozilla/firefox/*/logins.json`` reads a decoy there and is reported
for _rel in rules.credential_files(rules.STEALER_ONLY_STORES):
    HOME_DECOYS.setdefault(_rel, _decoy(_rel))
del _rel


def _ensure_dir(path: str) -> None:
    """``path`` and its parents made (0755) where it is not a directory already."""
    if not os.path.isdir(path):
        os.makedirs(path, 0o755, exist_ok=True)


def plant_decoys(home: str, token: str, decoys: Optional[Mapping[str, str]] = None,
                 device: Optional[int] = None) -> List[str]:
    """Write each decoy credential (default: :data:`DECOYS`) below ``home``
    (mode 0600), marked with ``token``; returns those planted. With
    ``device`` (a decoy home's tmpfs), only where the directory is on that
    filesystem: never through a grant bound inside the home
    (``--allow-write ~/.ssh``) onto a real file."""
    planted: List[str] = []
    for rel, template in (DECOYS if decoys is None else decoys).items():
        path = home + "/" + rel
        if device is None:
            _ensure_dir(os.path.dirname(path))
        elif not _dir_on(home, os.path.dirname(rel), device):
            continue
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(out, template.format(token=token).encode())
        finally:
            os.close(out)
        planted.append(rel)
    return planted


def _dir_on(home: str, rel: str, device: int) -> bool:
    """Make ``home/rel`` a directory, each step checked to be a directory on
    ``device`` (the decoy tmpfs) before anything is made in it: False where a
    step is something else (a grant bound there, a symlink)."""
    path = home
    for part in [p for p in rel.split("/") if p]:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if st.st_dev != device or not stat.S_ISDIR(st.st_mode):
            return False
        path = path + "/" + part
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        except OSError:
            return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_dev == device and stat.S_ISDIR(st.st_mode)


# ------------------------------------------------------------ the launcher side
class DecoyWatch:
    """The decoy inotify fd (taken from pid 1), read by the supervisor's loop
    while the run lasts (:meth:`read` when it is readable: no thread of its
    own): each decoy opened is one record (time, path)."""

    def __init__(self, fd: int, decoys: Mapping[int, str]) -> None:
        self.fd = fd
        self.decoys = {int(k): str(v) for k, v in decoys.items()}
        self.records: List[Tuple[float, str, str]] = []  # (time, path, "open"/"read")

    def fileno(self) -> int:
        return self.fd

    def read(self, chunks: int = 8) -> None:
        """Take in the events queued, at most ``chunks`` reads of 64 KiB (the
        fd is non-blocking; the supervisor's loop comes back while more wait,
        and its other work is not starved by a flood of reads)."""
        for _ in range(chunks):
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            now = time.time()
            offset = 0
            while offset + 16 <= len(data):
                wd, mask, _cookie, size = struct.unpack_from("iIII", data, offset)
                offset += 16 + size
                path = self.decoys.get(wd)
                # a watched directory also reports its entries (with a name): those decoys have their own watch
                if path is not None and mask & (IN_OPEN | IN_ACCESS) and not size:
                    self.records.append((now, path, "open" if mask & IN_OPEN else "read"))

    def stop(self, close: bool = True) -> List[Tuple[float, str, str]]:
        """Read what is left (and close the fd, unless ``close`` is False:
        then :meth:`close` later); the records."""
        self.read(chunks=1 << 16)  # every process is gone: the queue is finite
        if close:
            self.close()
        return self.records

    def close(self) -> None:
        """Close the fd (its last holder: the kernel destroys the inotify
        instance and waits for an SRCU grace period, ~10 ms)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

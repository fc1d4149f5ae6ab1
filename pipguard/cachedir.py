"""pipguard's private cache directory: ``PIPGUARD_CACHE_DIR``, else
``/var/tmp/pipguard-UID``.

Outside HOME, so that runs with another HOME (tests, CI jobs) share it. What
is kept there steers decisions (the VM backend's KVM probe and initramfs, the
gate's remembered findings), so the directory must be this user's alone:
created mode 0700, and refused when it is not ours or others may write it
(another local user could plant a lying entry)."""

from __future__ import annotations

import os
import stat

from pipguard.errors import PipguardError


class CacheDirError(PipguardError):
    """The cache directory exists but is not a private directory of this user."""


def private_dir(*parts: str) -> str:
    """The cache directory (or ``parts`` below it, made 0700 as needed)."""
    path = os.environ.get("PIPGUARD_CACHE_DIR") or f"/var/tmp/pipguard-{os.getuid()}"
    for level in (path, *(os.path.join(path, *parts[:i + 1]) for i in range(len(parts)))):
        try:
            os.mkdir(level, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise CacheDirError(f"cannot make pipguard's cache directory {level}: {exc.strerror}",
                                hint="set PIPGUARD_CACHE_DIR to a directory of your own") from exc
        info = os.lstat(level)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise CacheDirError(f"pipguard's cache {level} is not a private directory of this user",
                                hint="remove it, or set PIPGUARD_CACHE_DIR")
    return os.path.join(path, *parts)


def write_json(path: str, data: object) -> None:
    """``data`` as JSON at ``path`` (in a private directory), whole or not at all: written
    beside it and renamed, so that a concurrent reader never sees half an entry. An entry that
    cannot be written is simply not kept (a cache)."""
    import json

    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass

"""Sandboxed Pythons import pipguard's hook from a directory they may not write.

A fresh checkout or an editable install has no bytecode cache for the hook: the first
sandboxed Python would compile it and try to cache it, a blocked write that made a clean
build look "blocked". pipguard now caches it for its own interpreter before the run; a
Python of another version still tries, and that attempt is refused but informational.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

import pytest

import support
from pg import pipguard
from pipguard.sandbox.plan import HOOK_DIR, HOOK_FILES
from support import requires

pytestmark = [requires("linux"), requires("landlock", abi=6), requires("seccomp_user_notif")]


def _writing_bytecode(home) -> dict:
    # the test environment sets PYTHONDONTWRITEBYTECODE=1, which hides the problem
    return home.env({"PYTHONDONTWRITEBYTECODE": None})


def _drop_cache(tag: str) -> None:
    for path in glob.glob(os.path.join(HOOK_DIR, "__pycache__", f"*.{tag}.pyc")):
        os.unlink(path)


def test_own_interpreter_finds_the_hook_cached(tmp_path, fake_home):
    _drop_cache(sys.implementation.cache_tag)
    r = pipguard(["run", "--", sys.executable, "-c", "print('ok')"], cwd=tmp_path, env=_writing_bytecode(fake_home))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert r.report["verdict"] == "clean", r.report["events"]
    assert not [e for e in r.report["events"] if e["kind"] == "file-write"], r.report["events"]
    for name in HOOK_FILES:
        assert os.path.exists(importlib.util.cache_from_source(os.path.join(HOOK_DIR, name)))


def test_other_version_caching_the_hook_is_refused_but_not_a_finding(tmp_path, fake_home):
    mine = "%d.%d" % sys.version_info[:2]
    others = {v: p for v, p in support.python_versions().items() if v != mine}
    if not others:
        pytest.skip("no other Python version on this machine")
    version, python = next(iter(others.items()))
    _drop_cache("cpython-" + version.replace(".", ""))
    # the plain backend's supervisor reports the refused cache write (information); under ns
    # the hook dir is a read-only bind and no event is produced (docs/sandbox.md, ns limits)
    r = pipguard(["run", "--isolation", "os", "--", python, "-c", "print('ok')"], cwd=tmp_path,
                 env=_writing_bytecode(fake_home))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    cache_writes = [e for e in r.report["events"] if e["rule"] == "hook-bytecode"]
    assert cache_writes and all(e["action"] == "blocked" for e in cache_writes), r.report["events"]
    assert all(e["target"].startswith(os.path.join(HOOK_DIR, "__pycache__")) for e in cache_writes)
    assert r.report["verdict"] == "clean", r.report["events"]
    assert not glob.glob(os.path.join(HOOK_DIR, "__pycache__", f"*.cpython-{version.replace('.', '')}.pyc"))


def test_install_target_of_another_version_gets_the_hook_cached():
    from pipguard.sandbox.plan import precompile_hook

    mine = "%d.%d" % sys.version_info[:2]
    others = {v: p for v, p in support.python_versions().items() if v != mine}
    if not others:
        pytest.skip("no other Python version on this machine")
    version, python = next(iter(others.items()))
    tag = "cpython-" + version.replace(".", "")
    _drop_cache(tag)
    precompile_hook(python)  # what install does for its --python target
    for name in HOOK_FILES:
        assert os.path.exists(os.path.join(HOOK_DIR, "__pycache__", name[:-3] + f".{tag}.pyc"))

"""PKGBUILD directories and the ``pipguard pkgbuild`` CLI, for tests/test_pkgbuild.py and the VM
backend's tests (fixtures ``makepkg`` and ``pkgdir`` in tests/conftest.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from . import need, strict

MAKEPKG_TOOLS = ("makepkg", "bsdtar", "fakeroot", "gcc")


def need_makepkg() -> None:
    """Skip (fail under PIPGUARD_REQUIRE_ALL_LAYERS=1) unless makepkg and the layers work here."""
    if not all(shutil.which(tool) for tool in MAKEPKG_TOOLS):
        message = "makepkg not installed (apt-get install pacman-package-manager libarchive-tools fakeroot gcc)"
        if strict():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    need("landlock")
    need("seccomp")


def make_pkgdir(text: str, files=None) -> Path:
    """A 0o755 dir (outside pytest's 0o700 basetemp) with a PKGBUILD and ``files``."""
    d = Path(tempfile.mkdtemp(prefix="pipguard-pkgbuild-test-"))
    os.chmod(d, 0o755)
    (d / "PKGBUILD").write_text(text)
    for name, content in (files or {}).items():
        (d / name).write_text(content)
    return d


def review(directory, *args, env, timeout=300):
    """Run ``pipguard pkgbuild`` and return (exit status, report, stderr)."""
    report = Path(tempfile.mkdtemp(prefix="pipguard-pkgbuild-report-")) / "r.json"
    try:
        proc = subprocess.run([sys.executable, "-m", "pipguard", "pkgbuild", str(directory), "--report",
                               str(report), *args], env=env, cwd="/", stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)
        data = json.loads(report.read_text()) if report.exists() else None
    finally:
        shutil.rmtree(report.parent, ignore_errors=True)
    return proc.returncode, data, proc.stderr

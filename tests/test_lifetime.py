"""Stopping pipguard itself (Ctrl-C, SIGTERM) stops the whole sandbox and
still writes the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from test_evidence import live_argvs


def _alive_with(marker: str) -> list:
    return [argv for argv in live_argvs() if any(marker in a for a in argv)]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 130)])
def test_signal_to_pipguard_kills_tree_and_writes_report(tmp_path, fake_home, sig, status):
    work = tmp_path / "work"
    work.mkdir()
    report = work / "r.json"
    marker = f"pipguard-lifetime-{os.getpid()}-{sig}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipguard", "run", "--report", str(report), "--", "sh", "-c",
         f"(setsid sh -c 'sleep 300; true' {marker} &) ; sh -c 'sleep 300; true' {marker}"],
        cwd=work, env=fake_home.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(100):  # wait until both sleeps run (no timing assertion: a readiness poll)
        if len(_alive_with(marker)) >= 3:  # pipguard itself and the two shells
            break
        time.sleep(0.1)
    assert len(_alive_with(marker)) >= 3
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    data = json.loads(report.read_text())
    assert data["error"] and data["verdict"] == "error"
    assert any(p["killed_by_pipguard"] for p in data["processes"])
    assert _alive_with(marker) == []

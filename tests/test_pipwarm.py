"""WarmPip: the final pip of ``install`` imports itself early and runs only
what it is told, after the gate (real interpreters, real pip)."""

import subprocess
import sys
import time

from pipguard.pipwarm import WarmPip


def test_runs_the_command_it_is_given_later(tmp_path):
    warm = WarmPip(sys.executable, {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"})
    time.sleep(0.2)  # let it import; the command must still be waiting
    status, output = warm.run(["--version"])
    assert status == 0 and output.startswith("pip "), output
    warm.close()  # already finished: a no-op


def test_close_without_a_command_runs_nothing(tmp_path):
    warm = WarmPip(sys.executable, {"PATH": "/usr/bin:/bin"})
    output = warm.close()  # a refused install: the warm pip exits without running pip at all
    assert warm._proc.returncode == 0
    assert output == ""  # pip itself would have printed at least a usage error


def test_falls_back_to_a_cold_pip_when_the_warm_one_died(tmp_path):
    venv = tmp_path / "nopip"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    warm = WarmPip(python, {"PATH": "/usr/bin:/bin"})
    warm._proc.wait(timeout=30)  # no pip: the warm process exits at once...
    status, output = warm.run(["--version"])
    # ...and pip's own error reaches the user either way
    assert status != 0 and "No module named pip" in output, output

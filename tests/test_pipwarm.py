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


def _wheel(directory, name="pgdemo", version="1.0"):
    """A real wheel: a module, a console script, a ``#!python`` data script."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "def main():\n    print('hi')\n",
        f"{name}-{version}.data/scripts/{name}-raw": "#!python\nprint('raw')\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[console_scripts]\n{name} = {name}:main\n",
    }
    rows = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(rows + [f"{info}/RECORD,,"]) + "\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for arcname, text in files.items():
            z.writestr(arcname, text)
    return path


def _venv(path):
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return str(path / "bin" / "python")


def _installed(venv, name="pgdemo", version="1.0"):
    """What an install left behind, with the venv's own path taken out."""
    import glob
    import os

    site = glob.glob(str(venv / "lib" / "python*" / "site-packages"))[0]
    info = os.path.join(site, f"{name}-{version}.dist-info")
    out = {}
    for entry in sorted(os.listdir(info)):
        if entry == "RECORD":  # generated scripts embed the venv path, so their hashes differ
            rows = sorted(line.split(",")[0] for line in open(os.path.join(info, entry)))
            out[entry] = rows
        else:
            out[entry] = open(os.path.join(info, entry)).read()
    for script in (name, f"{name}-raw"):
        out["bin/" + script] = open(venv / "bin" / script).read().replace(str(venv), "VENV")
        out["bin/" + script + " mode"] = oct(os.stat(venv / "bin" / script).st_mode)
    out["module"] = sorted(os.listdir(os.path.join(site, name)))
    return out


def test_direct_route_installs_exactly_what_pip_install_does(tmp_path):
    wheel = _wheel(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"}
    pip_args = ["install", "--no-deps", "--no-index", "--find-links", str(tmp_path), "pgdemo==1.0"]
    reference = tmp_path / "by-pip"
    subprocess.run([_venv(reference), "-m", "pip", *pip_args, "-q"], check=True, env=env)
    direct = tmp_path / "direct"
    warm = WarmPip(_venv(direct), env)
    status, output = warm.run(pip_args, [("pgdemo", "1.0", str(wheel))])
    assert status == 0, output
    assert warm.direct  # it did take the direct route...
    assert _installed(direct) == _installed(reference)  # ...and it left what pip leaves
    assert "REQUESTED" in _installed(direct) and "direct_url.json" not in _installed(direct)


def test_an_installed_package_goes_through_pip(tmp_path):
    wheel = _wheel(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"}
    python = _venv(tmp_path / "venv")
    pip_args = ["install", "--no-deps", "--no-index", "--find-links", str(tmp_path), "pgdemo==1.0"]
    subprocess.run([python, "-m", "pip", *pip_args, "-q"], check=True, env=env)
    warm = WarmPip(python, env)
    status, output = warm.run(pip_args, [("pgdemo", "1.0", str(wheel))])
    # pip's own decision ("already satisfied"), not a second copy over the first
    assert status == 0 and not warm.direct and "already satisfied" in output, output


def test_a_failing_direct_install_fails_with_the_reason(tmp_path):
    wheel = _wheel(tmp_path)
    wheel.write_bytes(b"not a zip file")  # verified, then corrupted before the install
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"}
    warm = WarmPip(_venv(tmp_path / "venv"), env)
    status, output = warm.run(["install", "pgdemo==1.0"], [("pgdemo", "1.0", str(wheel))])
    assert status == 1 and warm.direct and "ERROR:" in output, output

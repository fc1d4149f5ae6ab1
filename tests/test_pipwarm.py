"""WarmPip: the final pip of ``install`` imports itself early and runs only
what it is told, after the gate (real interpreters, real pip)."""

import glob
import os
import subprocess
import sys
import time

import pytest

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


def _wheel(directory, name="pgdemo", version="1.0", tag="py3", extra=None):
    """A real wheel: a module, a console script, a ``#!python`` data script
    (and ``extra`` files, {archive name: text})."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "def main():\n    print('hi')\n",
        f"{name}-{version}.data/scripts/{name}-raw": "#!python\nprint('raw')\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}-none-any\n",
        f"{info}/entry_points.txt": f"[console_scripts]\n{name} = {name}:main\n",
        **(extra or {}),
    }
    rows = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(rows + [f"{info}/RECORD,,"]) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-{tag}-none-any.whl"
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


@pytest.fixture(params=["bundled", "26.3"])
def pip_version(request, wheelhouse):
    """The venv's own pip, and pip 26.3, whose install command enters an import
    guard before installing (the direct route must do the same)."""
    if request.param != "bundled" and sys.version_info < (3, 10):
        pytest.skip("pip 26.3 needs Python >= 3.10")
    return request.param


def _venv_with(path, pip_version, wheelhouse):
    python = _venv(path)
    if pip_version != "bundled":
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--find-links",
                        str(wheelhouse), f"pip=={pip_version}"], check=True,
                       env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"})
    return python


def test_direct_route_installs_exactly_what_pip_install_does(tmp_path, pip_version, wheelhouse):
    wheel = _wheel(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"}
    pip_args = ["install", "--no-deps", "--no-index", "--find-links", str(tmp_path), "pgdemo==1.0"]
    reference = tmp_path / "by-pip"
    subprocess.run([_venv_with(reference, pip_version, wheelhouse), "-m", "pip", *pip_args, "-q"],
                   check=True, env=env)
    direct = tmp_path / "direct"
    warm = WarmPip(_venv_with(direct, pip_version, wheelhouse), env)
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
    # pip's install_wheel refuses a member that escapes the environment
    wheel = _wheel(tmp_path, extra={"../../outside.txt": "x\n"})
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"}
    warm = WarmPip(_venv(tmp_path / "venv"), env)
    status, output = warm.run(["install", "pgdemo==1.0"], [("pgdemo", "1.0", str(wheel))])
    assert status == 1 and warm.direct and "outside the target directory" in output, output
    assert not (tmp_path / "outside.txt").exists()


def test_an_unreadable_wheel_goes_to_pip_for_its_error(tmp_path):
    wheel = _wheel(tmp_path)
    wheel.write_bytes(b"not a zip file")  # verified, then corrupted before the install
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"}
    warm = WarmPip(_venv(tmp_path / "venv"), env)
    status, output = warm.run(["install", "--no-index", "--find-links", str(tmp_path),
                               "pgdemo==1.0"], [("pgdemo", "1.0", str(wheel))])
    assert status != 0 and not warm.direct and "ERROR" in output, output


def test_the_final_pip_sees_no_source_but_the_verified_folder(tmp_path):
    """pip's own settings could add a find-links folder; for the same version pip
    prefers the more specific wheel there (py311 over py3), which nobody verified.
    An older version is installed, so this runs the full pip, not the direct route."""
    from pipguard.install import final_pip_env, pip_config

    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    old = _wheel(tmp_path / "old", version="1.0")
    verified = _wheel(tmp_path / "verified", version="2.0")
    tag = "py%d%d" % sys.version_info[:2]
    _wheel(tmp_path / "elsewhere", version="2.0", tag=tag, extra={"pgdemo/EVIL.py": "x = 1\n"})
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nfind-links = {tmp_path / 'elsewhere'}\n")
    users = dict(base, PIP_FIND_LINKS=str(tmp_path / "elsewhere"), PIP_CONFIG_FILE=str(config))
    args = ["install", "--no-deps", "--no-index", "--upgrade", "--find-links",
            str(tmp_path / "verified"), "pgdemo==2.0"]

    def install(venv, env):
        """Installed 2.0 over 1.0 with ``env``; whether the unverified file came in."""
        python = _venv(tmp_path / venv)
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", str(old)], check=True,
                       env=dict(base, PIP_CONFIG_FILE="/dev/null"))
        warm = WarmPip(python, env(python) if callable(env) else env)
        status, output = warm.run(args, [("pgdemo", "2.0", str(verified))])
        assert status == 0 and not warm.direct, output
        site = glob.glob(str(tmp_path / venv / "lib" / "python*" / "site-packages"))[0]
        return os.path.exists(os.path.join(site, "pgdemo", "EVIL.py"))

    # the verified wheel, from the verified folder only
    assert not install("guarded", lambda python: final_pip_env(users, pip_config(python, users)))
    # what the user's settings alone would do: the leak this guards against is real
    assert install("unguarded", users)


def test_final_pip_env_keeps_only_break_system_packages(tmp_path):
    from pipguard.install import final_pip_env

    env = {"PATH": "/usr/bin", "PIP_TARGET": "/tmp/x", "PIP_FIND_LINKS": "/tmp/y",
           "PIP_REQUIREMENT": "r.txt", "PIP_CONFIG_FILE": "/etc/mine.conf"}
    assert final_pip_env(env, {}) == {"PATH": "/usr/bin", "PIP_CONFIG_FILE": os.devnull}
    # a distribution's Python in a CI image: the user's explicit permission stays
    for env_value, config in ((("PIP_BREAK_SYSTEM_PACKAGES", "1"),), {}), \
                             ((), {"install.break-system-packages": "true"}):
        out = final_pip_env(dict(env, **dict(env_value)), config)
        assert out["PIP_BREAK_SYSTEM_PACKAGES"] == "1" and "PIP_TARGET" not in out

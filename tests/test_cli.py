"""The CLI's contract: bad input is one line on stderr and exit 2 with nothing
run or half-written; statuses follow DESIGN.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PY = sys.executable


def cli(*args, cwd, env=None, timeout=120):
    return subprocess.run([PY, "-m", "pipguard", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def work(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.mark.parametrize("args, words", [
    (["run", "--bogus", "--", "true"], "--bogus"),
    (["run"], "COMMAND"),
    (["run", "--"], "COMMAND"),
    (["run", "--", "no-such-command-pipguard"], "command not found"),
    (["run", "--", "./not-executable.sh"], "not executable"),
    (["run", "--report", "/nonexistent-dir/r.json", "--", "touch", "ran"], "does not exist"),
    (["run", "--timeout", "-1", "--", "touch", "ran"], "positive"),
    (["run", "--timeout", "soon", "--", "touch", "ran"], "soon"),
    (["run", "--allow-write", "/nonexistent-pipguard", "--", "touch", "ran"], "no such file"),
    (["run", "--allow-read", "/nonexistent-pipguard", "--", "touch", "ran"], "no such file"),
    (["run", "--format", "xml", "--", "touch", "ran"], "xml"),
    (["run", "--isolation", "paranoid", "--", "touch", "ran"], "paranoid"),
    (["run", "--allow-network", "--allow-host", "pypi.org", "--", "touch", "ran"], "contradict"),
    (["run", "--allow-host", "pypi.org:99999", "--", "touch", "ran"], "port"),
    # what names no host would never match one: refused, not accepted as a rule that never applies
    (["run", "--allow-host", "a b", "--", "touch", "ran"], "not HOST[:PORT]"),
    (["run", "--allow-host", "socket(inet6, dgram)", "--", "touch", "ran"], "not HOST[:PORT]"),
    (["run", "--allow-host", "a..b:443", "--", "touch", "ran"], "not HOST[:PORT]"),
    (["run", "--allow-host", "-x.example", "--", "touch", "ran"], "not HOST[:PORT]"),
    (["run", "--allow-host", "1.2.3", "--", "touch", "ran"], "not HOST[:PORT]"),
    (["run", "--allow-host", "[10.0.0.1]:80", "--", "touch", "ran"], "IPv6"),
    (["install", "--sandbox"], "nothing to install"),
    # checked while pip starts (pipguard starts pip first): pip is ended, nothing installed
    (["install", "--sandbox", "--allow-read", "/nonexistent-pipguard", "six"], "no such file"),
    (["install", "--sandbox", "--limit-memory", "lots", "six"], "lots"),
    (["install", "--sandbox", "--report", "/nonexistent-dir/r.json", "six"], "does not exist"),
    (["install", "--sandbox", "--allow-build-host", "pypi.org:99999", "six"], "--allow-build-host 'pypi.org:99999': port"),
    (["install", "--sandbox", "--python", "/nonexistent-python", "six"], "not an executable"),
    (["install", "--sandbox", "--allow-build-host", "a b", "six"], "--allow-build-host 'a b': not HOST"),
    # pipguard's own options misspelt: pipguard's "did you mean", not pip's usage
    (["install", "--sandbx", "six"], "did you mean --sandbox"),
    (["install", "--sandbox", "--isolaton", "os", "six"], "did you mean --isolation"),
    (["sandbox", "--probe-import", "six"], "did you mean --probe-imports"),
    (["frobnicate"], "frobnicate"),
])
def test_bad_input_is_one_line_exit_2(work, args, words):
    (work / "not-executable.sh").write_text("#!/bin/sh\ntouch ran\n")
    r = cli(*args, cwd=work)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert words.lower() in lines[0].lower()
    assert not (work / "ran").exists(), "nothing may run on bad input"
    assert not list(work.glob("*.json"))


@pytest.mark.parametrize("program", ["/bin/true", "/bin/echo", "/bin/false"])
def test_python_that_is_no_python_is_an_error(work, program):
    """``--python`` naming a program that is not a Python: pip never ran, whatever that
    program's exit status (``/bin/true`` exited 0 and pipguard said INSTALLED)."""
    r = cli("install", "--python", program, "six", cwd=work)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "not a CPython >= 3.9 with pip" in r.stderr and "INSTALLED" not in r.stderr


@pytest.mark.parametrize("host", ["pypi.org", "pypi.org:443", "[::1]:3128", "::1", "10.0.0.5:8080",
                                  "files.pythonhosted.org.", "b\u00fccher.example", "in_ternal.example"])
def test_allow_host_takes_host_and_port(host):
    from pipguard.sandbox.policy import HostPort

    parsed = HostPort.parse(host)
    assert str(parsed).isascii() and " " not in str(parsed)


def test_pipguards_table_of_pip_options_has_every_option_of_this_pip():
    """The table the "did you mean" check reads (it cannot import pip's parser while pip
    starts: that took longer than pip's own start, and pip's usage came first)."""
    from pip._internal.commands import create_command

    from pipguard.cli import install

    assert set(create_command("install").parser._long_opt) <= install.PIP_INSTALL_OPTIONS


def test_pip_options_near_pipguards_stay_pips(work):
    """``--isolated`` (pip's, close to pipguard's ``--isolation``) and an abbreviation of it
    are pip's to read: no "did you mean"."""
    for option in ("--isolated", "--isol"):
        r = cli("install", option, "--dry-run", "--no-index", "--find-links", str(work), "six", cwd=work)
        assert "did you mean" not in r.stderr, r.stderr


def test_an_option_that_fails_after_pip_started_ends_that_pip(work):
    """pipguard starts pip before it checks the rest of its own options (they load while pip
    starts): when one fails, that pip is ended and reaped before pipguard exits 2."""
    import os

    wrapper = work / "python"
    wrapper.write_text(f"#!/bin/sh\necho $$ > {work / 'pip.pid'}\nexec {PY} \"$@\"\n")
    wrapper.chmod(0o755)
    import shutil
    import tempfile

    short_tmp = tempfile.mkdtemp(prefix="pgt-", dir="/tmp")  # where the seam's socket goes
    try:
        r = cli("install", "--sandbox", "--python", str(wrapper), "--limit-memory", "lots", "six", cwd=work,
                env=dict(os.environ, TMPDIR=short_tmp))
        assert r.returncode == 2 and "lots" in r.stderr and "Traceback" not in r.stderr, r.stderr
        marker = work / "pip.pid"
        if marker.exists():  # (pip may be ended before its wrapper wrote it: ended either way)
            assert not os.path.exists(f"/proc/{int(marker.read_text())}"), "pip outlived pipguard"
        assert os.listdir(short_tmp) == []  # the seam's socket directory is gone too
    finally:
        shutil.rmtree(short_tmp)


def test_a_bug_in_pipguard_is_one_line_and_a_saved_traceback(tmp_path, monkeypatch, capsys):
    """Any exception that is not one of pipguard's errors (a bug) reaches the user as one line
    and exit 2, the traceback in a file the line names (for the bug report), never on stderr."""
    from pipguard.cli import app as pgcli

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again

    def buggy():
        return {}["no such key"]

    with pytest.raises(SystemExit) as exited:
        pgcli._with_errors(buggy)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "internal error: KeyError" in err
    (saved,) = tmp_path.glob("pipguard-crash-*.txt")
    assert str(saved) in err
    assert "Traceback" in saved.read_text() and "buggy" in saved.read_text()


@pytest.mark.parametrize("args, pip_words", [
    (["-r", "/nonexistent/req.txt"], "requirements file"),
    (["--no-such-pip-option", "x"], "no such option"),
])
def test_pip_errors_pass_through_as_pip_prints_them(work, args, pip_words):
    """Bad pip input is pip's to reject: pip's message, then pipguard's one line; exit 2."""
    r = cli("install", "--sandbox", *args, cwd=work)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert pip_words in r.stderr.lower() and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("pipguard: ERROR")


def test_refuses_home_or_root_as_build_dir(tmp_path):
    r = cli("run", "--", "true", cwd="/")
    assert r.returncode == 2 and "refusing" in r.stderr


def test_exit_status_passthrough(work):
    assert cli("run", "--", "sh", "-c", "exit 3", cwd=work).returncode == 3
    assert cli("run", "--", "sh", "-c", "kill -TERM $$", cwd=work).returncode == 128 + 15


def test_stdio_passes_through_and_json_on_stdout(work):
    """With the report on stdout, stdout is the report's alone: the command's output goes
    to stderr (as pip's does under install), so the report parses."""
    r = cli("run", "--format", "json", "--", "sh", "-c", "echo out; echo err >&2", cwd=work)
    assert r.returncode == 0
    report = json.loads(r.stdout)
    assert report["schema"] == "pipguard.report/1" and report["verdict"] == "clean"
    assert "out\n" in r.stderr and "err\n" in r.stderr


@pytest.mark.parametrize("fmt", ["json", "sarif"])
def test_report_on_stdout_is_utf8_json_for_any_argument(work, fmt):
    """A command line that is not UTF-8 (and a command writing such bytes): stdout is the
    report, valid UTF-8 JSON with no lone surrogate; the byte is shown as its escape."""
    proc = subprocess.run([PY, "-m", "pipguard", "run", "--format", fmt, "--", "sh", "-c",
                           'printf "%s\\n" "$1"', "sh", b"caf\xff"], cwd=work, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.decode("utf-8")  # strict
    data = json.loads(text)
    assert "\\ud" not in text and "caf\\\\xff" in text
    assert b"caf\xff\n" in proc.stderr
    assert data


def test_report_file_gets_the_chosen_format(work):
    """README's ``pipguard run --report r.sarif --format sarif -- make``: SARIF in the file,
    the command's stdout untouched, pipguard's summary on stderr; with the default format
    (table, for a human) the file gets JSON."""
    r = cli("run", "--report", "r.sarif", "--format", "sarif", "--", "echo", "made", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "made\n"
    assert json.loads((work / "r.sarif").read_text())["version"] == "2.1.0"
    assert "CLEAN" in r.stderr
    r = cli("run", "--report", "r.json", "--", "echo", "made", cwd=work)
    assert r.stdout == "made\n"
    assert json.loads((work / "r.json").read_text())["schema"] == "pipguard.report/1"


def test_sarif_output(work, fake_home):
    # the command's output kept off stdout: under ns the read succeeds (on a decoy)
    r = cli("run", "--format", "sarif", "--", "sh", "-c", 'cat "$1" > /dev/null', "sh",
            str(fake_home.secrets["id_rsa"]), cwd=work, env=fake_home.env())
    sarif = json.loads(r.stdout)
    assert sarif["version"] == "2.1.0"
    results = sarif["runs"][0]["results"]
    assert results and results[0]["ruleId"] in ("home-read", "secret-read", "decoy-read")


def test_help_explains(work):
    for args in (["--help"], ["run", "--help"], ["install", "--help"], ["sandbox", "--help"],
                 ["doctor", "--help"]):
        r = cli(*args, cwd=work)
        assert r.returncode == 0 and "Usage" in r.stdout
    assert "124" in cli("run", "--help", cwd=work).stdout
    assert "refused" in cli("install", "--help", cwd=work).stdout


def test_doctor_json(work):
    r = cli("doctor", "--format", "json", cwd=work)
    data = json.loads(r.stdout)
    assert r.returncode == (1 if data["default_isolation_degraded"] else 0)
    assert {c["name"] for c in data["checks"]} >= {"landlock.fs", "seccomp"}


def test_package_exports_the_library_api():
    import pipguard
    from pipguard import sandbox
    from pipguard.sandbox.policy import Policy

    assert pipguard.run is sandbox.run and pipguard.Policy is Policy
    with pytest.raises(AttributeError):
        pipguard.no_such_name


def test_library_rejects_unknown_policy_settings():
    from pipguard.errors import PolicyError
    from pipguard.sandbox import run_sandboxed

    with pytest.raises(PolicyError, match="allow_netwrk"):
        run_sandboxed(["true"], allow_netwrk=True)


def test_run_sandboxed_returns_status(work):
    from pipguard import run_sandboxed  # the package exports it (lazily)

    assert run_sandboxed(["sh", "-c", "exit 7"], cwd=str(work)) == 7
    assert run_sandboxed(["sleep", "30"], cwd=str(work), timeout=1) == 124


def _readme_run_example():
    """The README's block with ``pipguard run -- sh -c 'cat ~/.ssh/id_rsa …'``: its ``$ `` lines."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    # fenced blocks: the text between a fence line and the next (odd-numbered parts)
    for block in readme.split("\n```")[1::2]:
        lines = [line[2:] for line in block.splitlines() if line.startswith("$ ")]
        if any("pipguard run -- sh -c 'cat ~/.ssh/id_rsa" in line for line in lines):
            return lines
    raise AssertionError("README lost its pipguard run example")


def test_readmes_run_example_works_from_a_new_shell(fake_home, loopback_tcp):
    """The README's ``pipguard run`` example, typed into a shell that starts in ``~`` as a new
    user's does: it was refused there ("refusing to make ~ writable"); the README now says
    where to run it. Harmless here: ``/root/.aws/credentials`` is read as the fake home's, and
    the connection goes to a loopback listener (which must get nothing)."""
    import os
    from pathlib import Path

    lines = _readme_run_example()
    script = "set -e\n" + "\n".join(
        line.replace("/root/.aws/credentials", "~/.aws/credentials")
            .replace("10.0.0.1/443", f"127.0.0.1/{loopback_tcp.port}")
        for line in lines)
    env = fake_home.env({"PATH": f"{Path(PY).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    r = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=fake_home.path, env=env,
                       capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    assert "refusing to make" not in out, out
    assert r.returncode == 1, out  # the command's status: its connection failed
    assert "pipguard-decoy" in out or "secret-read" in out, out
    assert not any(m in out for m in fake_home.markers.values()), out
    assert "BLOCKED" in out and "10.0.0.1" not in out
    assert not loopback_tcp.received


# -- what the fast path loads ----------------------------------------------------------------
_LOADED = r"""
import json, sys
from pipguard.sandbox import api
def at_run(*args, **kwargs):  # the sandbox would start here
    raise SystemExit(0)
api.run = at_run
from pipguard.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("pipguard.cli", "click")))))
"""
_COMMANDS = {"pipguard.cli.run", "pipguard.cli.install", "pipguard.cli.approve", "pipguard.cli.pkgbuild",
             "pipguard.cli.doctor", "pipguard.cli.doctor_checks"}


@pytest.mark.parametrize("argv, command_module", [(["run", "--", "true"], "pipguard.cli.run"),
                                                  (["--version"], None)])
def test_the_fast_path_loads_no_click_and_only_its_command(argv, command_module, tmp_path):
    """``pipguard run -- CMD`` and ``--version`` start without click and without the other
    commands' modules (start-up cost; ``install``'s is checked in test_install_seam.py)."""
    proc = subprocess.run([PY, "-c", _LOADED, *argv], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *shown, last = proc.stdout.splitlines()
    imported = set(json.loads(last))
    assert {"pipguard.cli.app", "pipguard.cli.options"} <= imported, imported
    assert not imported & ({"click"} | _COMMANDS - {command_module}), imported
    if command_module is None:
        assert shown and shown[0].startswith("pipguard, version"), proc.stdout
    else:
        assert command_module in imported, imported

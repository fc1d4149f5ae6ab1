"""Terminal control sequences from a package never reach the user's terminal raw (issue 33).

A package chooses its build's output, the paths it touches, the version its PKG-INFO claims and
the member paths of its wheel; pipguard prints all of these (its progress lines, its summary,
its refusal texts, the messages pip prints for it) and pip prints the build's output (on a
failure, and as it comes with ``-v``). Each test below runs a real install of a package that
puts an OSC 52 clipboard write, a screen clear, a window title and a cursor move over a fake
"Successfully installed" line into each of those, and asserts that none of the raw sequences
is in pipguard's stdout or stderr -- while what was seen is still shown, escaped, and the
JSON report keeps the exact data. An honest colour in the build's output survives.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

from support import build_sdist
from support.pipinstall import listing, pg_install
from support.projects import write_project
from support.wheels import make_wheel

CLIPBOARD = "\x1b]52;c;cGlwZ3VhcmQtY2xpcGJvYXJk\x07"  # OSC 52: write "pipguard-clipboard" to the clipboard
CLEAR = "\x1b[2J"
TITLE = "\x1b]0;pgtitle\x07"
FAKE_LINE = "\r\x1b[1ASuccessfully installed pgfake-9.9"
HOSTILE = CLIPBOARD + CLEAR + TITLE + FAKE_LINE
HONEST_COLOUR = "\x1b[32mpg-honest-green\x1b[0m"

#: the raw sequences that must never be in what pipguard (or pip, for it) printed
RAW = [b"\x1b]52;", b"\x1b[2J", b"\x1b]0;", b"\x1b[1A", b"\x07", b"\r"]
#: any ESC that does not start a colour
_NOT_A_COLOUR = re.compile(rb"\x1b(?!\[[0-9;:]*m)")

BUILD = """\
import os, sys
HOSTILE = {hostile!r}
sys.stdout.write({honest!r} + "\\n")
sys.stdout.write("pg-build-output " + HOSTILE + "\\n")
sys.stdout.flush()
# one sequence split across two writes: the ESC ends one write, its body starts the next
sys.stderr.buffer.write(b"pg-split \\x1b")
sys.stderr.flush()
sys.stderr.buffer.write(b"]52;c;c3BsaXQ=\\x07 end\\n")
sys.stderr.flush()
if {secret!r}:
    try:
        open({secret!r}).read()
    except OSError:
        pass
"""


def _assert_inert(out: bytes, where: str) -> None:
    for raw in RAW:
        assert raw not in out, (where, raw, out[-3000:])
    assert _NOT_A_COLOUR.search(out) is None, (where, out[-3000:])


def _hostile_project(tmp_path, name, secret=""):
    proj = write_project(tmp_path / "src", name)
    setup = proj / "setup.py"
    setup.write_text(BUILD.format(hostile=HOSTILE, honest=HONEST_COLOUR, secret=secret) + setup.read_text())
    # the version pipguard names the package by comes from PKG-INFO (pip's comes from the metadata hook)
    (proj / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0{HOSTILE}\n")
    return proj


def test_a_refused_build_cannot_drive_the_terminal(tmp_path, fake_home, route, target):
    """The build prints the sequences (pip shows them with -v and on the failure), claims a
    version holding them (pipguard's progress lines and summary name it), and reads a
    credential file whose name holds them (the blocked attempt, the refusal text, pip's
    message): all escaped; the report keeps the exact path. Both routes (find-links, the
    loopback index)."""
    secret = fake_home.path / ".ssh" / f"id_{HOSTILE}"
    secret.write_text("pg-canary\n")
    extra = route.add(tmp_path / "extra")
    build_sdist(_hostile_project(tmp_path, "pgescape", str(secret)), extra, "pgescape", "1.0")
    before = listing(target)
    proc, report = pg_install(["-v", "pgescape"], home=fake_home, target=target, route=route, cwd=tmp_path, raw=True)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    _assert_inert(proc.stdout, "stdout")
    _assert_inert(proc.stderr, "stderr")
    # what was there is shown, escaped
    assert b"pg-build-output \\x1b]52;c;cGlwZ3VhcmQtY2xpcGJvYXJk\\x07\\x1b[2J" in proc.stderr + proc.stdout
    assert b"pg-split \\x1b]52;c;c3BsaXQ=\\x07 end" in proc.stderr + proc.stdout
    assert b"1.0\\x1b]52;c;" in proc.stderr  # the version, in pipguard's progress lines and summary
    # the honest colour of the build's output is kept (pip -v shows it)
    assert HONEST_COLOUR.encode() in proc.stdout + proc.stderr
    # the report is data: the exact path that was read
    assert report["status"] == "refused"
    targets = [e["target"] for e in report["events"] if e["action"] == "blocked"]
    assert str(secret) in targets, targets


def test_a_wheel_member_path_cannot_drive_the_terminal(tmp_path, fake_home, links, target):
    """A wheel refused by the gate for a .pth whose name holds the sequences: the findings
    table, the refusal text and pip's message show it escaped; --format json on stdout is
    the exact member as JSON data, inert on a terminal."""
    extra = links.add(tmp_path / "extra")
    member = f"pg{HOSTILE}\nSuccessfully installed pgfake-9.9\n.pth"
    make_wheel(extra, {"pgwheel/__init__.py": b"", member: b"import os\n"}, name="pgwheel")
    for fmt in ("table", "json", "markdown", "sarif"):
        before = listing(target)
        proc, report = pg_install(["--format", fmt, "pgwheel"], home=fake_home, target=target, route=links,
                                  cwd=tmp_path, raw=True)
        assert proc.returncode == 1, (fmt, proc.stderr[-3000:])
        assert listing(target) == before
        _assert_inert(proc.stdout, f"{fmt} stdout")
        _assert_inert(proc.stderr, f"{fmt} stderr")
        # no line of pipguard's starts with the fake text: the newline in the name is escaped
        for line in (proc.stdout + proc.stderr).splitlines():
            assert not line.startswith(b"Successfully installed pgfake"), (fmt, line)
        assert report["status"] == "refused"
        members = [f["member"] for p in report["packages"] for f in p["findings"]]
        assert member in members, members
        if fmt == "table":
            assert b"\\x1b]52;c;cGlwZ3VhcmQtY2xpcGJvYXJk\\x07" in proc.stderr
        if fmt == "json":
            shown = json.loads(proc.stdout)
            assert member in [f["member"] for p in shown["packages"] for f in p["findings"]]


def test_an_honest_build_keeps_its_colour_and_installs(tmp_path, fake_home, links, target):
    """No false alarm: a build that prints colour (as gcc, cmake and ninja do) installs as
    with pip, and pip -v shows its colour as it was."""
    extra = links.add(tmp_path / "extra")
    proj = write_project(tmp_path / "src", "pgcolour")
    setup = proj / "setup.py"
    setup.write_text(f"print({HONEST_COLOUR!r}, flush=True)\n" + setup.read_text())
    build_sdist(proj, extra)
    proc, report = pg_install(["-v", "pgcolour"], home=fake_home, target=target, route=links, cwd=tmp_path,
                              raw=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["status"] == "installed"
    assert HONEST_COLOUR.encode() in proc.stdout + proc.stderr
    _assert_inert(proc.stdout + proc.stderr, "output")


NAMING_BACKEND = """\
import os
from setuptools.build_meta import *  # noqa: F401,F403 (every other hook as setuptools has it)
from setuptools import build_meta as _setuptools


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    hostile = name[:-len(".whl")] + {hostile!r} + ".whl"
    os.rename(os.path.join(wheel_directory, name), os.path.join(wheel_directory, hostile))
    return hostile
"""


def test_a_wheel_name_build_wheel_returns_cannot_drive_the_terminal(tmp_path, fake_home, links, target):
    """Found while fixing this: pip prints the name build_wheel returns ("Created wheel for X:
    filename=…") as it is, before pip or the gate look at the wheel, and the name's platform
    tag may hold anything but whitespace. Plain pipguard installed the package and pip printed
    the title sequence; now the call is refused (its status 1: pip never reads the name) and
    reported, with the name escaped."""
    proj = write_project(tmp_path / "src", "pgnamed")
    (proj / "backend.py").write_text(NAMING_BACKEND.format(hostile=TITLE + CLIPBOARD))
    (proj / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n'
                                         'build-backend = "backend"\nbackend-path = ["."]\n')
    extra = links.add(tmp_path / "extra")
    build_sdist(proj, extra)
    before = listing(target)
    proc, report = pg_install(["pgnamed"], home=fake_home, target=target, route=links, cwd=tmp_path, raw=True)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    _assert_inert(proc.stdout, "stdout")
    _assert_inert(proc.stderr, "stderr")
    assert report["status"] == "refused"
    assert [r["phase"] for r in report["refusals"]] == ["build_wheel"], report["refusals"]
    assert b"returned a name with control characters" in proc.stderr
    assert b"\\x1b]0;pgtitle\\x07" in proc.stderr


# --------------------------------------------------------------------------- pipguard run
def _run(args, home, cwd):
    return subprocess.run([sys.executable, "-m", "pipguard", "run", *args], cwd=cwd, env=home.env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180)


def test_run_report_and_error_lines_cannot_drive_the_terminal(tmp_path, fake_home):
    """``pipguard run``: a blocked read of a path holding the sequences, a C1 CSI and a bidi
    override, shown in the table (stderr), and on stdout as SARIF and JSON -- which stay the
    exact data (the SARIF renderer writes ensure_ascii=False: C1 and U+202E were raw) -- and an
    error line quoting a path (the --report directory) holds none of them raw."""
    name = f"id_{HOSTILE}\u009b2J\u202eevil"
    secret = fake_home.path / ".ssh" / name
    secret.write_text("pg-canary\n")
    # the plain backend: the read is refused on the host's own path, and reported with it
    command = ["--isolation", "os", "--", "cat", str(secret)]
    table = _run(command, fake_home, tmp_path)
    assert table.returncode != 0
    _assert_inert(table.stdout + table.stderr, "table")
    assert "\\x1b]52;c;cGlwZ3VhcmQtY2xpcGJvYXJk\\x07".encode() in table.stderr
    for fmt in ("sarif", "json"):
        proc = _run(["--format", fmt, *command], fake_home, tmp_path)
        _assert_inert(proc.stdout + proc.stderr, fmt)
        for raw in ("\u009b", "\u202e"):
            assert raw.encode() not in proc.stdout, (fmt, raw)
        # the exact path, as data (both sides written by json.dumps: the same escapes)
        assert json.dumps(str(secret)) in json.dumps(json.loads(proc.stdout)), fmt
    bad = _run(["--report", str(tmp_path / f"no-{HOSTILE}\u202e" / "r.json"), "--", "true"], fake_home, tmp_path)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.count(b"\n") == 1 and b"no-\\x1b]52;" in bad.stderr, bad.stderr
    _assert_inert(bad.stdout + bad.stderr, "error line")
    assert "\u202e".encode() not in bad.stderr

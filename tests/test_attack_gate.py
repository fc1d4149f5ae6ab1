"""An attacker against the gate's newest rules (issue 33): spellings of entry_points.txt, .pth path
entries and METADATA that plain pip acts on and the gate did not see, a data file that lands in
the standard library of a Python used without a venv -- and honest real packages the
shadows-other check refused. Each attack is first shown to work with plain pip (both pips), then
refused and reported by pipguard. Harmless: canaries, loopback, fake HOME."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support import build_sdist
from support.handbackend import write_hand_project
from support.pipinstall import listing, make_venv, pg_install, pip_list
from support.wheels import make_wheel

CANARY = "print('CANARY-attack-gate')\n"


def _plain_pip(venv: Path, args, *, env=None, cwd=None) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "PIP_CONFIG_FILE": os.devnull}
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", *args],
                          env=env or base, capture_output=True, text=True, cwd=cwd)


def _blocking(findings, rule):
    from pipguard.gate import scan as gate

    return [f for f in findings if f.rule == rule and f.severity in gate.BLOCKING_SEVERITIES]


def _reported(report, rule):
    return [f for p in report["packages"] for f in p["findings"] if f["rule"] == rule]


def _plain_installs_pipguard_refuses(name, rule, *, pip, tmp_path, fake_home, links, wheelhouse) -> Path:
    """Plain pip installs ``name`` into a fresh venv (returned, to show the effect); pipguard
    refuses it into another, changing nothing, and reports ``rule``."""
    plain = make_venv(tmp_path / "plain", pip, wheelhouse)
    done = _plain_pip(plain, [*links.args(), name])
    assert done.returncode == 0, done.stderr[-2000:]
    target = make_venv(tmp_path / "target", pip, wheelhouse)
    before = listing(target)
    proc, report = pg_install([name], home=fake_home, target=target, route=links, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    assert _reported(report, rule), report["packages"]
    return plain


# --- entry_points.txt as pip reads it ---------------------------------------------------------------

# importlib.metadata (pip on Python >= 3.11) names a section by the line stripped of every `[` and
# `]` at its ends, and only `#` starts a comment: `;ssh` is an entry that distlib <= 0.3.9 (pip <=
# 25) writes as `ssh`.
SCRIPT_SPELLINGS = {
    "double-brackets": ("[[console_scripts]]\ngit = {pkg}:main\n", "git", ("bundled", "26.3")),
    "semicolon-name": ("[console_scripts]\n;ssh = {pkg}:main\n", "ssh", ("bundled",)),
    "gui-half-open": ("[[gui_scripts]\ncurl = {pkg}:main\n", "curl", ("bundled", "26.3")),
}


@pytest.mark.parametrize("spelling", sorted(SCRIPT_SPELLINGS))
def test_script_entries_as_pip_reads_them_are_judged(spelling, tmp_path):
    from pipguard.gate import scan as gate

    text, command, _ = SCRIPT_SPELLINGS[spelling]
    wheel = make_wheel(tmp_path, {"epx/__init__.py": b"def main():\n    pass\n"}, name="epx",
                       entry_points=text.format(pkg="epx"))
    found = _blocking(gate.scan_wheel(wheel), "console-script-shadowing")
    assert found and f"'{command}'" in found[0].message, gate.scan_wheel(wheel)


def test_a_script_entry_pip_reads_over_the_interpreter_is_an_overwrite(tmp_path, wheelhouse):
    """`[[console_scripts]] python = ...`: pip writes bin/python over the venv's interpreter."""
    from pipguard.gate import scan as gate
    from pipguard.gate.ownership import target_layout

    venv = make_venv(tmp_path / "venv", "bundled", wheelhouse)
    wheel = make_wheel(tmp_path, {"epy/__init__.py": b"def main():\n    pass\n"}, name="epy",
                       entry_points="[[console_scripts]]\npython = epy:main\n")
    found = gate.check_ownership([gate.WheelToInstall(str(wheel))], target_layout(str(venv / "bin" / "python")))
    assert [f for f in found if f.rule == "overwrites-other" and f.evidence.endswith("/bin/python")], found


@pytest.mark.parametrize("pip", ["bundled", "26.3"])
@pytest.mark.parametrize("spelling", sorted(SCRIPT_SPELLINGS))
def test_a_shadowing_command_spelled_as_pip_reads_it_is_refused(spelling, pip, tmp_path, fake_home, links,
                                                                 wheelhouse):
    text, command, shadows_with = SCRIPT_SPELLINGS[spelling]
    if pip not in shadows_with:
        pytest.skip(f"pip {pip} does not write {command!r} for this spelling")
    extra = links.add(tmp_path / "extra")
    make_wheel(extra, {"epz/__init__.py": f"def main():\n    {CANARY}".encode()}, name="epz",
               entry_points=text.format(pkg="epz"))
    plain = _plain_installs_pipguard_refuses("epz", "console-script-shadowing", pip=pip, tmp_path=tmp_path,
                                             fake_home=fake_home, links=links, wheelhouse=wheelhouse)
    assert (plain / "bin" / command).exists(), sorted(os.listdir(plain / "bin"))


# --- a .pth path entry to a directory the wheel fills ----------------------------------------------

PTH_DIR = {"pthdir_hook.pth": b"pthdir\n", "pthdir/sitecustomize.py": CANARY.encode(),
           "pthpkg/__init__.py": b""}


def test_a_startup_module_in_a_pth_path_entry_is_critical(tmp_path):
    """site.py appends <site>/pthdir to sys.path, then imports sitecustomize from anywhere on it."""
    from pipguard.gate import scan as gate

    for spelling in ("pthdir", "./pthdir/", "pthdir/.", "pthdir//"):
        members = dict(PTH_DIR, **{"pthdir_hook.pth": spelling.encode() + b"\n"})
        directory = tmp_path / spelling.replace("/", "s").replace(".", "d")
        directory.mkdir()
        wheel = make_wheel(directory, members, name="pthdir")
        assert _blocking(gate.scan_wheel(wheel), "sitecustomize"), (spelling, gate.scan_wheel(wheel))
    # through the data scheme's site-packages too
    wheel = make_wheel(tmp_path, {"pthdir-1.0.data/data/lib/python3.11/site-packages/hook.pth": b"pthdir\n",
                                  "pthdir/usercustomize.py": CANARY.encode()}, name="pthdir")
    assert _blocking(gate.scan_wheel(wheel), "usercustomize"), gate.scan_wheel(wheel)


def test_an_archive_as_a_pth_path_entry_is_refused(tmp_path):
    """A zip member named by a .pth line is imported from (zipimport): its sitecustomize runs."""
    from pipguard.gate import scan as gate

    wheel = make_wheel(tmp_path, {"arch_hook.pth": b"arch.zip\n", "arch.zip": b"PK\x05\x06" + bytes(18)},
                       name="arch")
    assert _blocking(gate.scan_wheel(wheel), "pth-path-archive"), gate.scan_wheel(wheel)


def test_an_honest_pth_path_entry_passes(tmp_path):
    from pipguard.gate import scan as gate

    wheel = make_wheel(tmp_path, {"honest.pth": b"honest_lib\n", "honest_lib/honest/__init__.py": b""},
                       name="honest")
    assert [f for f in gate.scan_wheel(wheel) if f.severity in gate.BLOCKING_SEVERITIES] == []


@pytest.mark.parametrize("pip", ["bundled", "26.3"])
def test_a_pth_path_entry_to_a_startup_module_is_refused(pip, tmp_path, fake_home, links, wheelhouse):
    extra = links.add(tmp_path / "extra")
    make_wheel(extra, PTH_DIR, name="pthdir")
    plain = _plain_installs_pipguard_refuses("pthdir", "sitecustomize", pip=pip, tmp_path=tmp_path,
                                             fake_home=fake_home, links=links, wheelhouse=wheelhouse)
    start = subprocess.run([str(plain / "bin" / "python"), "-c", "pass"], capture_output=True, text=True)
    assert "CANARY-attack-gate" in start.stdout, start  # runs at every interpreter start


# --- METADATA whose headers pass unread ------------------------------------------------------------

def test_a_wheel_unlike_its_prepared_metadata_behind_a_large_body_is_refused(tmp_path, fake_home, links, target,
                                                                              loopback_tcp):
    """build_wheel's METADATA adds a requirement by URL and a 17 MiB body (the gate read no
    METADATA over 16 MiB, so neither metadata-mismatch nor direct-reference looked). Plain pip
    installs it and keeps it in its cache; pipguard refuses at the build."""
    from pipguard.gate.coremeta import MAX_METADATA_BYTES

    extra = links.add(tmp_path / "extra")
    requires = [f"leak @ http://127.0.0.1:{loopback_tcp.port}/data"]
    build_sdist(write_hand_project(tmp_path / "src", "handbig", members={"handbig/__init__.py": ""},
                                   built_requires=requires, built_body=MAX_METADATA_BYTES + (1 << 20)), extra)
    before = listing(target)
    proc, report = pg_install(["handbig"], home=fake_home, target=target, route=links, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    assert any(r["kind"] == "output" and any("metadata-mismatch" in s for s in r["seen"])
               for r in report["refusals"]), report["refusals"]
    assert not loopback_tcp.received
    plain = _plain_pip(target, [*links.args(), "handbig"], env=fake_home.env(), cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "handbig" in pip_list(target)


def test_metadata_headers_are_read_past_a_large_body_and_unread_headers_differ():
    from pipguard.gate.coremeta import MAX_METADATA_BYTES, CoreMetadata, read_headers

    head = b"Metadata-Version: 2.1\r\nName: x\r\nVersion: 1\r\nRequires-Dist: y @ http://h/\r\n\r\n"
    big = read_headers((head + b"." * MAX_METADATA_BYTES)[:MAX_METADATA_BYTES + 1])
    assert big.requires_dist == frozenset({"y @ http://h/"}) and not big.unread
    endless = read_headers(b"Name: x\nDescription: " + b"." * MAX_METADATA_BYTES)
    assert endless.unread
    prepared = CoreMetadata.parse(b"Name: x\nVersion: 1\n\n")
    assert prepared.differences(endless)


# --- the data scheme into the standard library -----------------------------------------------------

@pytest.mark.parametrize("member, rule", [
    ("lib/python3.11/sitecustomize.py", "sitecustomize"),
    ("lib/python3.11/json/__init__.py", "data-scheme-escape"),
    ("lib/python311.zip", "data-scheme-escape"),
])
def test_a_data_file_in_the_standard_library_is_refused(member, rule, tmp_path):
    from pipguard.gate import scan as gate

    wheel = make_wheel(tmp_path, {f"stdx-1.0.data/data/{member}": CANARY.encode()}, name="stdx")
    assert _blocking(gate.scan_wheel(wheel), rule), gate.scan_wheel(wheel)


def test_plain_pip_puts_a_data_file_in_the_prefix_standard_library(tmp_path, wheelhouse):
    """With pip's prefix the interpreter's (a system or container Python, here a prefix made of
    links to this interpreter's standard library), `.data/data/lib/pythonX.Y/sitecustomize.py`
    runs at every start."""
    import sys
    import sysconfig

    ver = "python%d.%d" % sys.version_info[:2]
    prefix = tmp_path / "prefix"
    stdlib = prefix / "lib" / ver
    stdlib.mkdir(parents=True)
    real = Path(sysconfig.get_paths()["stdlib"])
    for entry in real.iterdir():
        if entry.name != "site-packages":
            (stdlib / entry.name).symlink_to(entry)
    wheel = make_wheel(tmp_path, {f"stdx-1.0.data/data/lib/{ver}/sitecustomize.py": CANARY.encode()},
                       name="stdx")
    venv = make_venv(tmp_path / "venv", "bundled", wheelhouse)
    done = _plain_pip(venv, ["--no-index", "--prefix", str(prefix), str(wheel)])
    assert done.returncode == 0, done.stderr[-2000:]
    base = Path(sys.base_prefix) / "bin" / ver
    start = subprocess.run([str(base), "-c", "pass"], capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"], "PYTHONHOME": str(prefix)})
    assert "CANARY-attack-gate" in start.stdout, start


# --- shadows-other and honest real packages --------------------------------------------------------

PYTEST_SHIM = {"py.py": b"# shim for pylib going away\n# if pylib is installed this file will get skipped\n",
               "_pytest/__init__.py": b"", "pytest/__init__.py": b""}
PYLIB = {"py/__init__.py": b"", "py/path.py": b""}


@pytest.mark.parametrize("first, second", [("pytest", "py"), ("py", "pytest")])
def test_pytest_and_the_py_library_share_py_as_designed(first, second, tmp_path, wheelhouse):
    """pytest (7.2+) ships py.py, a shim that gives way to the py library's py/ package: plain pip
    installs both in either order, and so must pipguard."""
    from pipguard.gate import scan as gate
    from pipguard.gate.ownership import target_layout

    members = {"pytest": PYTEST_SHIM, "py": PYLIB}
    venv = make_venv(tmp_path / "venv", "bundled", wheelhouse)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    installed = make_wheel(tmp_path / "a", members[first], name=first)
    done = _plain_pip(venv, ["--no-index", "--no-deps", str(installed)])
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = make_wheel(tmp_path / "b", members[second], name=second)
    layout = target_layout(str(venv / "bin" / "python"))
    assert gate.check_ownership([gate.WheelToInstall(str(wheel))], layout) == []
    # anyone else's py/ beside pytest's py.py still takes over `import py`
    if first == "pytest":
        other = make_wheel(tmp_path, {"py/__init__.py": CANARY.encode()}, name="notpy")
        found = gate.check_ownership([gate.WheelToInstall(str(other))], layout)
        assert [f for f in found if f.rule == "shadows-other"], found

"""Where pip writes each wheel member (pipguard.gate.wheelpaths), checked against the real pips, and
the gate's rules over every spelling of a dangerous member (issue 33: `./x.pth`, `a//b` and the
`.data/<scheme>/` forms skipped the rules that judged the raw name)."""
from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest

from support.wheels import EVIL_PTH, make_wheel
from pipguard.gate import scan as gate, wheelpaths
from pipguard.gate.ownership import target_layout

# Spellings pip accepts, each with content naming it; none makes pip refuse the wheel.
SPELLINGS = {
    "./p1.pth": "site:p1.pth",
    "d1//m2.py": "site:d1/m2.py",
    "demo.data/purelib//m3.py": "site:m3.py",
    "demo.data/purelib/./m4.py": "site:m4.py",
    "demo.data//platlib/m5.py": "site:m5.py",
    "./demo.data/purelib/m6.py": "site:demo.data/purelib/m6.py",  # raw first part is '.': root
    "demo.data/./scripts/s1": "scripts:s1",
    "demo.data/scripts/./s2": "scripts:s2",
    "demo.data/data/./share/d3.txt": "data:share/d3.txt",
    "d4/./d5/../m7.py": "site:d4/m7.py",
}


def _predicted(member: str) -> str:
    placed = wheelpaths.place(member)
    assert placed is not None and placed.error is None, member
    scheme = "site" if placed.site_path is not None else placed.scheme
    return f"{scheme}:{placed.path}"


def test_place_reads_each_spelling_as_pip_does():
    for member, where in SPELLINGS.items():
        assert _predicted(member) == where, member


@pytest.mark.parametrize("pip", ["bundled", "26.3"])
def test_place_agrees_with_the_real_pip(pip, tmp_path, wheelhouse):
    """Install a wheel of odd spellings with the real pip: each member's content is found where
    place() says it lands (both pips)."""
    from support.pipinstall import make_venv

    files = {m: f"# {m}\n".encode() for m in SPELLINGS}
    wheel = make_wheel(tmp_path, files)
    venv = make_venv(tmp_path / "venv", pip, wheelhouse)
    env = {"PATH": os.environ["PATH"], "PIP_CONFIG_FILE": os.devnull}
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", str(wheel)], check=True, env=env)
    layout = target_layout(str(venv / "bin" / "python"))
    dirs = {"site": layout.purelib, "scripts": layout.scripts, "data": layout.data}
    for member, where in SPELLINGS.items():
        scheme, path = where.split(":", 1)
        landed = Path(dirs[scheme], path)
        assert landed.is_file(), f"{member}: pip did not write {landed}"
        assert landed.read_bytes() == files[member], member


def _spellings(canonical: str):
    """Equivalent spellings of ``canonical`` that pip writes to the same place: './' in front,
    and each separator doubled or given a '/./'."""
    seps = [i for i, c in enumerate(canonical) if c == "/"]
    out = {canonical, "./" + canonical, ".//" + canonical, "././" + canonical}
    for choice in itertools.product(("/", "//", "/./"), repeat=len(seps)):
        text = list(canonical)
        for i, sep in zip(reversed(seps), reversed(choice)):
            text[i:i + 1] = sep
        spelled = "".join(text)
        out.add(spelled)
        out.add("./" + spelled)
        out.add(".//" + spelled)
    # '<name>.data' must stay the raw first component for pip to read it as a scheme
    return sorted(s for s in out if not canonical.startswith("demo.data/") or s.startswith("demo.data/"))


#: dangerous members, canonical spelling -> (rule the gate must give, content)
DANGEROUS = {
    "evil.pth": ("pth-exec", EVIL_PTH),
    "demo.data/purelib/evil.pth": ("pth-exec", EVIL_PTH),
    "demo.data/platlib/evil.pth": ("pth-exec", EVIL_PTH),
    "sitecustomize.py": ("sitecustomize", b"print('x')\n"),
    "usercustomize/__init__.py": ("usercustomize", b"print('x')\n"),
    "demo.data/purelib/sitecustomize.py": ("sitecustomize", b"print('x')\n"),
    "demo.data/scripts/pip": ("console-script-shadowing", b"#!python\n"),
    "demo.data/data/bin/sudo": ("console-script-shadowing", b"#!/bin/sh\n"),
    "demo.data/data/lib/python3.11/site-packages/evil.pth": ("pth-exec", EVIL_PTH),
    "_distutils_hack/__init__.py": ("startup-module", b""),
}


@pytest.mark.parametrize("canonical", sorted(DANGEROUS))
def test_every_spelling_of_a_dangerous_member_is_judged(canonical, tmp_path):
    rule, content = DANGEROUS[canonical]
    spellings = _spellings(canonical)
    assert len(spellings) > 2
    for n, spelled in enumerate(spellings):
        directory = tmp_path / str(n)
        directory.mkdir()
        wheel = make_wheel(directory, {spelled: content, "demo/__init__.py": b""})
        findings = gate.scan_wheel(wheel)
        got = [f for f in findings if f.rule == rule and f.severity in gate.BLOCKING_SEVERITIES]
        assert got, f"{spelled!r}: no {rule} finding in {[(f.rule, f.severity) for f in findings]}"


def test_two_spellings_of_one_file_are_a_finding(tmp_path):
    wheel = make_wheel(tmp_path, {"demo/__init__.py": b"", "./demo/__init__.py": b"import os\n"})
    found = [f for f in gate.scan_wheel(wheel) if f.rule == "record-mismatch"]
    assert any("lands where" in f.message for f in found), found


@pytest.mark.parametrize("name", ["sub/../git", "x/ssh", "a b/sudo"])
def test_a_console_script_name_with_a_path_is_judged_as_written(name, tmp_path):
    """distlib in pip <= 25 writes the trailing name (`sub/../git` -> `git`); pip 26 normalises
    the whole name. Either way the command is shadowed."""
    wheel = make_wheel(tmp_path, {"demo/__init__.py": b""},
                       entry_points=f"[console_scripts]\n{name} = demo:main\n")
    assert [f for f in gate.scan_wheel(wheel) if f.rule == "console-script-shadowing"]


def test_script_names_follow_both_distlibs():
    assert wheelpaths.script_names("sub/../git", "demo:main") == ("git",)
    assert wheelpaths.script_names("tool", "demo:main") == ("tool",)
    assert set(wheelpaths.script_names("bin/x/tool", "demo:main")) == {"bin/x/tool", "tool"}
    # pip 26 refuses a name leaving the scripts directory; pip 23's distlib writes the tail
    assert wheelpaths.script_names("../../site-packages/sitecustomize.py", "demo:main") == (
        "sitecustomize.py",)


def test_members_pip_refuses_are_reported():
    for member in ("demo.data/purelib", "demo.data/bogus/x.py", "demo.data/../x.py"):
        placed = wheelpaths.place(member)
        assert placed is not None and placed.error, member


def test_an_overwrite_spelled_oddly_is_found(tmp_path, wheelhouse):
    """ownership reads members through place(): `./othpkg/__init__.py` overwrites othpkg."""
    from support.pipinstall import make_venv

    venv = make_venv(tmp_path / "venv", "bundled", wheelhouse)
    other = make_wheel(tmp_path, {"othpkg/__init__.py": b"x = 1\n"}, name="othpkg")
    env = {"PATH": os.environ["PATH"], "PIP_CONFIG_FILE": os.devnull}
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", str(other)],
                   check=True, env=env)
    (tmp_path / "evil").mkdir()
    evil = make_wheel(tmp_path / "evil", {".//othpkg/./__init__.py": b"x = 2\n"}, name="evil")
    layout = target_layout(str(venv / "bin" / "python"))
    found = gate.check_ownership([gate.WheelToInstall(str(evil))], layout)
    assert [f for f in found if f.rule == "overwrites-other"], found

"""The static gate (pipguard.gate.scan) on real artifacts: wheels written here with a correct RECORD,
one wheel built by pip from a tiny project, and released wheels downloaded once per machine.

Released wheels are cached in ``~/.cache/pipguard-tests/gate`` (``PIPGUARD_TEST_CACHE=DIR`` moves it
to ``DIR/gate``; ``PIPGUARD_OFFLINE=1`` never downloads). Without them the tests skip, or fail under
``PIPGUARD_REQUIRE_ALL_LAYERS=1``.
"""
from __future__ import annotations

import dataclasses
import io
import shutil
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Dict, Tuple

import pytest

import support
from support import gatewheels
from support.wheels import EVIL_PTH, NSPKG_LINE, make_wheel
from support.projects import pyproject
from pipguard.gate import scan as gate
from pipguard.gate import startup
from pipguard.errors import PipError, UsageError
from pipguard.gate.scan import Finding, scan_artifact, scan_sdist, scan_wheel

# --- building wheels ------------------------------------------------------------------------------


def rules(findings, severity=None):
    return sorted({f.rule for f in findings if severity is None or f.severity == severity})


def only(findings, rule):
    got = [f for f in findings if f.rule == rule]
    assert got, f"no {rule} finding in {findings}"
    return got


# --- released wheels, fetched once ----------------------------------------------------------------

#: setuptools wheels covering every distutils-precedence.pth text shipped (49.3-49.x, 50-59, 60+).
SETUPTOOLS_PINS = ("setuptools==49.6.0", "setuptools==59.8.0", "setuptools==75.3.0",
                   "setuptools==80.9.0")
#: Popular wheels that must produce no finding at all.
ECOSYSTEM_PINS = ("requests==2.32.3", "six==1.16.0", "attrs==24.2.0", "packaging==24.2",
                  "wheel==0.45.1", "typing_extensions==4.12.2", "idna==3.10", "certifi==2024.8.30",
                  "pip==24.3.1", "Cython==3.0.11")


def _unavailable(msg: str):
    if support.strict():
        pytest.fail(f"{msg} (PIPGUARD_REQUIRE_ALL_LAYERS=1)", pytrace=False)
    pytest.skip(msg)


def _fetch(pins) -> Dict[str, Path]:
    try:
        return gatewheels.fetch(pins)
    except gatewheels.GateWheelsUnavailable as exc:
        _unavailable(str(exc))
        raise


@pytest.fixture(scope="session")
def setuptools_wheels() -> Dict[str, Path]:
    return _fetch(SETUPTOOLS_PINS)


@pytest.fixture(scope="session")
def ecosystem_wheels() -> Dict[str, Path]:
    return _fetch(ECOSYSTEM_PINS)


# --- rule 1: .pth files ---------------------------------------------------------------------------

SETUPTOOLS_LINE = (b"import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, "
                   b"'local') == 'local'; enabled and __import__('_distutils_hack').add_shim(); \n")


def test_malicious_pth_is_critical(tmp_path):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo-hook.pth": EVIL_PTH})
    findings = scan_wheel(whl)
    (f,) = only(findings, "pth-exec")
    assert f.severity == "critical" and f.member == "demo-hook.pth" and f.line == 1
    assert f.evidence.startswith("import os; os.system(")
    assert f.package == "demo" and f.artifact == whl.name
    assert findings[0] is f  # most severe first


def test_benign_path_pth_has_no_finding(tmp_path):
    pth = b"# vendored plugins\n\ndemo_plugins\nsub/dir\n  import os\n"  # indented: a path, per site.py
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo.pth": pth})
    assert scan_wheel(whl) == ()


def test_pth_outside_site_dir_is_harmless(tmp_path):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo/data/evil.pth": EVIL_PTH,
                                "demo-1.0.data/data/share/demo/x.pth": EVIL_PTH})
    assert scan_wheel(whl) == ()


@pytest.mark.parametrize("member", ["demo-1.0.data/purelib/x.pth", "demo-1.0.data/platlib/x.pth",
                                    "demo-1.0.data/data/lib/python3.11/site-packages/x.pth"])
def test_pth_in_other_site_roots_is_critical(tmp_path, member):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", member: EVIL_PTH})
    assert only(scan_wheel(whl), "pth-exec")[0].severity == "critical"


@pytest.mark.parametrize("content", [
    b"import\tos;os.system('id')\n",
    b"# harmless\rimport os\n",            # universal newlines (Python <= 3.12)
    b"# harmless\x0cimport os\n",          # str.splitlines (Python >= 3.13)
    b"\xef\xbb\xbfimport os\n",            # BOM stripped by utf-8-sig (Python >= 3.13)
    "# x\u2028import os\n".encode(),       # U+2028 line separator (Python >= 3.13)
])
def test_hidden_import_lines_are_found(tmp_path, content):
    whl = make_wheel(tmp_path, {"demo.pth": content})
    assert only(scan_wheel(whl), "pth-exec")[0].severity == "critical"


def test_pth_path_escape_is_high(tmp_path):
    whl = make_wheel(tmp_path, {"demo.pth": b"../../../../tmp/hijack\n/opt/evil\nfine/dir\n"})
    got = only(scan_wheel(whl), "pth-path-escape")
    assert [(f.severity, f.line) for f in got] == [("high", 1), ("high", 2)]


def test_editable_finder_pth_in_a_normal_wheel_is_critical_and_says_why(tmp_path):
    whl = make_wheel(tmp_path, {"__editable___demo_1_0_finder.py": b"",
                                "__editable__.demo-1.0.pth":
                                    b"import __editable___demo_1_0_finder; "
                                    b"__editable___demo_1_0_finder.install()\n"})
    (f,) = only(scan_wheel(whl), "pth-exec")
    assert f.severity == "critical" and "not built editable" in f.message


def test_editable_path_pth_in_a_normal_wheel_is_high(tmp_path):
    whl = make_wheel(tmp_path, {"__editable__.demo-1.0.pth": b"/home/dev/src/demo\n"})
    (f,) = scan_wheel(whl)
    assert (f.rule, f.severity) == ("pth-path-escape", "high")


def test_huge_site_pth_is_not_read_but_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(startup, "MAX_PTH_BYTES", 16)
    whl = make_wheel(tmp_path, {"demo.pth": b"x" * 64 + b"\n"})
    (f,) = scan_wheel(whl)
    assert (f.rule, f.severity) == ("pth-exec", "critical") and "not read" in f.message


# --- editable installs (PEP 660), built by the real backends --------------------------------------

#: One setuptools release per distinct `_FINDER_TEMPLATE` (pthshapes.SETUPTOOLS_FINDER_DIGESTS);
#: setuptools < 70.1 needs `wheel` to build.
EDITABLE_SETUPTOOLS = ("setuptools==64.0.0", "setuptools==65.1.1", "setuptools==65.3.0",
                       "setuptools==68.1.0", "setuptools==68.1.2", "setuptools==68.2.2",
                       "setuptools==70.0.0", "setuptools==75.8.0")
EDITABLE_HELPERS = ("wheel==0.45.1", "editables==0.5")


@pytest.fixture(scope="session")
def editable_tools(tmp_path_factory) -> Dict[str, Path]:
    """Each pin's wheel unpacked into its own directory (a pure wheel is importable as is)."""
    wheels = _fetch(EDITABLE_SETUPTOOLS + EDITABLE_HELPERS)
    root = tmp_path_factory.mktemp("editable-tools")
    out = {}
    for pin, whl in wheels.items():
        dest = root / pin.replace("==", "-")
        with zipfile.ZipFile(whl) as zf:
            zf.extractall(dest)
        out[pin] = dest
    return out


def _project(root: Path, name: str, src_layout: bool) -> Path:
    proj = root / f"{name}-proj"
    pkg = proj / "src" / name if src_layout else proj / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (proj / "pyproject.toml").write_text(pyproject(
        name, "setuptools", "setuptools.build_meta",
        tail="" if src_layout else f'[tool.setuptools]\npackages = ["{name}"]\n'))
    return proj


def build_editable(project: Path, paths, out: Path, home: Path) -> Path:
    """What pip does for `pip install -e project`: the backend's PEP 660 `build_editable` hook."""
    out.mkdir(exist_ok=True)
    code = ("import sys; sys.path[:0] = sys.argv[1:]; import setuptools.build_meta as b; "
            f"print(b.build_editable({str(out)!r}))")
    proc = subprocess.run([sys.executable, "-I", "-c", code, *map(str, paths)], cwd=str(project),
                          env=support.clean_env(home), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("pin", EDITABLE_SETUPTOOLS)
def test_setuptools_editable_finder_is_informational_for_its_project(tmp_path, editable_tools, pin):
    """Flat layout: setuptools writes `import __editable___demo_1_0_finder; ...install()` and the
    finder module; recognised (info) for its project, critical for any other wheel."""
    proj = _project(tmp_path, "demo", src_layout=False)
    whl = build_editable(proj, [editable_tools[pin], editable_tools["wheel==0.45.1"]],
                         tmp_path / "out", tmp_path / "home")
    with zipfile.ZipFile(whl) as zf:
        assert "__editable___demo_1_0_finder.py" in zf.namelist(), pin
    (f,) = scan_wheel(whl, editable_project=proj)
    assert (f.severity, f.rule) == ("info", "pth-known-hook"), (pin, f)
    assert "setuptools-editable-finder" in f.message and "__editable___demo_1_0_finder" in f.message
    (quiet,) = scan_wheel(whl)
    assert (quiet.severity, quiet.rule) == ("critical", "pth-exec")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (loud,) = scan_wheel(whl, editable_project=elsewhere)
    assert loud.severity == "critical" and str(proj / "demo") in loud.message


def test_setuptools_editable_path_line_is_informational_for_its_project(tmp_path, editable_tools):
    """src layout: setuptools writes the absolute src directory as a plain path line."""
    proj = _project(tmp_path, "demo", src_layout=True)
    whl = build_editable(proj, [editable_tools["setuptools==75.8.0"]], tmp_path / "out", tmp_path / "home")
    (f,) = scan_wheel(whl, editable_project=proj)
    assert (f.severity, f.rule, f.evidence) == ("info", "pth-editable-path", str((proj / "src").resolve()))
    (g,) = scan_wheel(whl)
    assert (g.severity, g.rule) == ("high", "pth-path-escape")


def _rewrite(whl: Path, directory: Path, replace: Dict[str, bytes]) -> Path:
    """The wheel's members with some replaced (RECORD recomputed: only the change is wrong)."""
    with zipfile.ZipFile(whl) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if not n.endswith(("/RECORD", ".dist-info/METADATA",
                                                                          ".dist-info/WHEEL"))}
    files.update(replace)
    directory.mkdir()
    return make_wheel(directory, {k: v for k, v in files.items() if v is not None})


@pytest.fixture(scope="module")
def real_finder_wheel(tmp_path_factory, editable_tools):
    """setuptools' editable wheel of a project, built once (a real backend run: ~1.5 s): the
    tests read it and rewrite copies."""
    tmp_path = tmp_path_factory.mktemp("finder")
    proj = _project(tmp_path, "demo", src_layout=False)
    whl = build_editable(proj, [editable_tools["setuptools==75.8.0"]], tmp_path / "out", tmp_path / "home")
    with zipfile.ZipFile(whl) as zf:
        finder = zf.read("__editable___demo_1_0_finder.py").decode()
        pth = zf.read("__editable__.demo-1.0.pth").decode()
    return proj, whl, finder, pth


@pytest.mark.parametrize("change", [
    "extra statement in the finder", "finder calls os.system in MAPPING", "finder maps /etc",
    "extra statement in the .pth line", "another module", "finder module missing",
    "exec in the .pth line",
])
def test_near_miss_editable_finder_is_critical(tmp_path, real_finder_wheel, change):
    proj, whl, finder, pth = real_finder_wheel
    mod, line = "__editable___demo_1_0_finder.py", pth.strip()
    replace = {
        "extra statement in the finder": {mod: (finder + "\nimport os\nos.system('id')\n").encode()},
        "finder calls os.system in MAPPING": {mod: finder.replace(
            "MAPPING: dict[str, str] = {", "MAPPING: dict[str, str] = {**__import__('os').system('id'), ").encode()},
        "finder maps /etc": {mod: finder.replace(str(proj / "demo"), "/etc").encode()},
        "extra statement in the .pth line": {"__editable__.demo-1.0.pth": (line + "; import os\n").encode()},
        "another module": {"__editable__.demo-1.0.pth": b"import evil_finder; evil_finder.install()\n",
                           "evil_finder.py": finder.encode()},
        "finder module missing": {mod: None},
        "exec in the .pth line": {"__editable__.demo-1.0.pth": (
            "import __editable___demo_1_0_finder; exec('__editable___demo_1_0_finder.install()')\n").encode()},
    }[change]
    crafted = _rewrite(whl, tmp_path / "crafted", replace)
    (f,) = only(scan_wheel(crafted, editable_project=proj), "pth-exec")
    assert f.severity == "critical", change
    # the untouched wheel, rewritten the same way, is still only informational
    same = _rewrite(whl, tmp_path / "same2", {})
    assert [g.severity for g in scan_wheel(same, editable_project=proj)] == ["info"]


def test_editables_bootstrap_is_informational_for_its_project(tmp_path, editable_tools):
    """The `editables` library (hatchling's dev-mode-exact, pdm-backend) writes
    `_editable_impl_<name>.pth` with `import _editable_impl_<name>` and that module."""
    proj = _project(tmp_path, "demo", src_layout=False)
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); from editables import EditableProject; "
            "p = EditableProject('demo', sys.argv[2]); p.map('demo', 'demo'); p.add_to_path('extra'); "
            "print(json.dumps(dict(p.files())))")
    (proj / "extra").mkdir()
    proc = subprocess.run([sys.executable, "-I", "-c", code, str(editable_tools["editables==0.5"]), str(proj)],
                          stdout=subprocess.PIPE, universal_newlines=True, check=True)
    files = {k: v.encode() for k, v in json.loads(proc.stdout).items()}
    assert set(files) == {"demo.pth", "_editable_impl_demo.py"}
    # hatchling writes the .pth as `_<name>.pth`
    whl = make_wheel(tmp_path, {"_demo.pth": files["demo.pth"], "_editable_impl_demo.py": files["_editable_impl_demo.py"]})
    got = scan_wheel(whl, editable_project=proj)
    assert sorted((f.severity, f.rule) for f in got) == [("info", "pth-editable-path"), ("info", "pth-known-hook")]
    assert only(scan_wheel(whl), "pth-exec")[0].severity == "critical"
    evil = files["_editable_impl_demo.py"] + b"\nF.map_module('os', '/tmp/evil/os.py')\n"
    crafted = make_wheel(tmp_path / "..", {"_demo.pth": files["demo.pth"], "_editable_impl_demo.py": evil},
                         name="crafted")
    assert only(scan_wheel(crafted, editable_project=proj), "pth-exec")[0].severity == "critical"


# --- known start-up hooks in released wheels ----------------------------------------------------

#: pin -> (the .pth member, its shape, how many executable lines)
HOOK_WHEELS = {
    "coverage==7.13.0": ("a1_coverage.pth", "coverage-subprocess", 1),   # leading blank lines in CODE
    "coverage==7.17.5": ("a1_coverage.pth", "coverage-subprocess", 1),
    "pytest-cov==2.12.1": ("pytest-cov.pth", "pytest-cov-subprocess", 1),
    "pytest-cov==6.0.0": ("pytest-cov.pth", "pytest-cov-subprocess", 1),
    "zope.interface==5.5.2": ("zope.interface-5.5.2-py3.10-nspkg.pth", "nspkg", 1),
    "matplotlib==3.6.3": ("matplotlib-3.6.3-py3.11-nspkg.pth", "nspkg", 1),
    "protobuf==3.20.3": ("protobuf-3.20.3-nspkg.pth", "nspkg", 1),
    "googleapis-common-protos==1.56.4": ("googleapis_common_protos-1.56.4-py3.10-nspkg.pth", "nspkg", 3),
}


@pytest.fixture(scope="session")
def hook_wheels() -> Dict[str, Path]:
    return _fetch(HOOK_WHEELS)


@pytest.mark.parametrize("pin", sorted(HOOK_WHEELS))
def test_released_start_up_hooks_are_informational(hook_wheels, pin):
    member, shape, count = HOOK_WHEELS[pin]
    findings = scan_wheel(hook_wheels[pin])
    assert [(f.severity, f.rule, f.member) for f in findings] == [("info", "pth-known-hook", member)] * count, pin
    assert all(f"({shape})" in f.message for f in findings)


def _hook_line(hook_wheels, pin) -> Tuple[str, str]:
    member = HOOK_WHEELS[pin][0]
    with zipfile.ZipFile(hook_wheels[pin]) as zf:
        return member, zf.read(member).decode().splitlines()[0]


@pytest.mark.parametrize("pin,edit", [
    ("coverage==7.17.5", lambda l: l + "; import os"),                                  # extra statement
    ("coverage==7.17.5", lambda l: l.replace("import coverage", "import coverage_x")),  # other module
    ("coverage==7.17.5", lambda l: l.replace("exec(", "eval(")),
    ("pytest-cov==6.0.0", lambda l: l.replace("init()", "init(); os.system(\\'id\\')")),
    ("protobuf==3.20.3", lambda l: l.replace("types.ModuleType('google')", "__import__('evil')")),
    ("protobuf==3.20.3", lambda l: l.replace("*('google',)", "*('google', 'x')")),          # name disagrees
    ("protobuf==3.20.3", lambda l: l.replace("sys._getframe(1).f_locals['sitedir']", "'/tmp'")),
])
def test_near_miss_hooks_are_critical(tmp_path, hook_wheels, pin, edit):
    member, line = _hook_line(hook_wheels, pin)
    crafted = edit(line)
    assert crafted != line
    name = pin.split("==")[0]
    # the files of the namespace an nspkg line registers come with it (a wheel fills its own)
    own = {"google/protobuf/__init__.py": b""} if name == "protobuf" else {}
    whl = make_wheel(tmp_path, {member: (crafted + "\n").encode(), **own}, name=name.replace("-", "_"),
                     meta_name=name)
    (f,) = only(scan_wheel(whl), "pth-exec")
    assert f.severity == "critical"
    # the released line in the same crafted wheel is recognised: only the edit made it critical
    other = tmp_path / "orig"
    other.mkdir()
    orig = make_wheel(other, {member: (line + "\n").encode(), **own}, name=name.replace("-", "_"),
                      meta_name=name)
    assert [g.severity for g in scan_wheel(orig)] == ["info"]


@pytest.mark.parametrize("pin", ["coverage==7.17.5", "pytest-cov==6.0.0"])
def test_owner_hooks_in_another_wheel_are_critical(tmp_path, hook_wheels, pin):
    member, line = _hook_line(hook_wheels, pin)
    whl = make_wheel(tmp_path, {member: (line + "\n").encode()}, name="evil")
    (f,) = only(scan_wheel(whl), "pth-exec")
    assert f.severity == "critical" and "in a wheel that is not" in f.message
    # quiet form: the owner's name in METADATA only, not in the file name and .dist-info
    other = tmp_path / "q"
    other.mkdir()
    quiet = make_wheel(other, {member: (line + "\n").encode()}, name="evil", meta_name=pin.split("==")[0])
    assert only(scan_wheel(quiet), "pth-exec")[0].severity == "critical"


def test_nspkg_lines_any_distribution_may_ship(tmp_path, hook_wheels):
    """A namespace loader imports only the standard library: recognised in any wheel, by content
    (a different file name changes nothing)."""
    member, line = _hook_line(hook_wheels, "protobuf==3.20.3")
    whl = make_wheel(tmp_path, {"whatever.pth": (line + "\n").encode(), "google/other/__init__.py": b""},
                     name="other")
    (f,) = scan_wheel(whl)
    assert (f.severity, f.rule) == ("info", "pth-known-hook") and "namespace package google" in f.message


@pytest.mark.parametrize("namespace, files", [("google", {}), ("email", {"email/evil.py": b""}),
                                              ("json", {"json/__init__.py": b""})])
def test_an_nspkg_line_binds_only_the_wheels_own_namespace(namespace, files, tmp_path, hook_wheels):
    """Issue 33: setuptools' loader registers its namespace in sys.modules at every start: for a
    namespace the wheel ships nothing in (another package's), or a standard-library name
    (`email`: site-packages/email/* then loads instead of the stdlib), it takes over imports."""
    member, line = _hook_line(hook_wheels, "protobuf==3.20.3")
    line = line.replace("'google'", repr(namespace))
    assert repr(namespace) in line
    whl = make_wheel(tmp_path, {"x-nspkg.pth": (line + "\n").encode(), **files}, name="other")
    found = [f for f in scan_wheel(whl) if f.rule == "pth-exec"]
    assert found and found[0].severity == "critical", scan_wheel(whl)


# --- setuptools' own .pth -------------------------------------------------------------------------

def test_real_setuptools_wheels_have_only_the_informational_shim(setuptools_wheels):
    for pin, whl in setuptools_wheels.items():
        with zipfile.ZipFile(whl) as zf:
            assert "distutils-precedence.pth" in zf.namelist(), pin
        (f,) = scan_wheel(whl)
        assert (f.severity, f.rule, f.member) == ("info", "pth-known-hook", "distutils-precedence.pth"), pin
        assert "distutils-precedence" in f.message and "SETUPTOOLS_USE_DISTUTILS" in f.message


def test_setuptools_pth_variants_are_the_released_ones(setuptools_wheels):
    shipped = set()
    for whl in setuptools_wheels.values():
        with zipfile.ZipFile(whl) as zf:
            shipped.add(startup.normalise_pth_line(zf.read("distutils-precedence.pth").decode()))
    assert shipped == {startup.normalise_pth_line(v) for v in gate.SETUPTOOLS_PTH_LINES}


def test_setuptools_line_in_other_wheel_is_critical(tmp_path):
    whl = make_wheel(tmp_path, {"evil/__init__.py": b"", "distutils-precedence.pth": SETUPTOOLS_LINE},
                     name="evil")
    (f,) = only(scan_wheel(whl), "pth-exec")
    assert f.severity == "critical" and "in a wheel that is not setuptools" in f.message


def test_setuptools_allowance_needs_exact_text_and_agreeing_names(tmp_path):
    extra = make_wheel(tmp_path, {"distutils-precedence.pth": SETUPTOOLS_LINE + b"import evil\n",
                                  "_distutils_hack/__init__.py": b""}, name="setuptools")
    (bad,) = only(scan_wheel(extra), "pth-exec")
    assert (bad.severity, bad.line, bad.evidence) == ("critical", 2, "import evil")
    other = tmp_path / "o"
    other.mkdir()
    fake = make_wheel(other, {"distutils-precedence.pth": SETUPTOOLS_LINE}, name="evil",
                      meta_name="setuptools")
    assert only(scan_wheel(fake), "pth-exec")[0].severity == "critical"


def test_distutils_hack_in_other_wheel_is_critical(tmp_path):
    whl = make_wheel(tmp_path, {"_distutils_hack/__init__.py": b"import os\n"})
    assert only(scan_wheel(whl), "startup-module")[0].severity == "critical"


# --- rule 2: sitecustomize / usercustomize --------------------------------------------------------

@pytest.mark.parametrize("member,rule", [
    ("sitecustomize.py", "sitecustomize"),
    ("usercustomize/__init__.py", "usercustomize"),
    ("sitecustomize.cpython-311-x86_64-linux-gnu.so", "sitecustomize"),
    ("sitecustomize.pyc", "sitecustomize"),
    ("demo-1.0.data/purelib/usercustomize.py", "usercustomize"),
    ("demo-1.0.data/data/lib/python3.11/site-packages/sitecustomize.py", "sitecustomize"),
])
def test_startup_customize_modules_are_critical(tmp_path, member, rule):
    whl = make_wheel(tmp_path, {member: b"import os\n"})
    assert only(scan_wheel(whl), rule)[0].severity == "critical"


def test_nested_sitecustomize_is_fine(tmp_path):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo/sitecustomize.py": b""})
    assert scan_wheel(whl) == ()


# --- rule 3: console scripts ----------------------------------------------------------------------

def test_console_script_named_pip_is_high(tmp_path):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b""}, entry_points="""
        [console_scripts]
        demo = demo:main
        pip = demo:main
        [gui_scripts]
        python3.12 = demo:main
        """)
    got = only(scan_wheel(whl), "console-script-shadowing")
    assert {(f.severity, f.evidence) for f in got} == {("high", "pip = demo:main"),
                                                      ("high", "python3.12 = demo:main")}


def test_installed_scripts_that_shadow_are_high(tmp_path):
    whl = make_wheel(tmp_path, {"demo-1.0.data/scripts/sudo": b"#!/bin/sh\n",
                                "demo-1.0.data/data/bin/git": b"#!/bin/sh\n",
                                "demo-1.0.data/scripts/demo-tool": b"#!/bin/sh\n"})
    got = only(scan_wheel(whl), "console-script-shadowing")
    assert sorted(f.member for f in got) == ["demo-1.0.data/data/bin/git", "demo-1.0.data/scripts/sudo"]


def test_pip_may_install_pip(tmp_path):
    whl = make_wheel(tmp_path, {"pip/__init__.py": b""}, name="pip", entry_points="""
        [console_scripts]
        pip = pip._internal.cli.main:main
        pip3 = pip._internal.cli.main:main
        pip3.12 = pip._internal.cli.main:main
        """)
    assert scan_wheel(whl) == ()


# --- rule 4: path traversal -----------------------------------------------------------------------

@pytest.mark.parametrize("member", ["../evil", "demo/../../evil", "/etc/cron.d/evil",
                                    "demo-1.0.data/scripts/../../../.bashrc", "..\\..\\evil"])
def test_traversal_member_is_critical(tmp_path, member):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", member: b"x"})
    got = [f for f in only(scan_wheel(whl), "path-traversal") if f.member == member]
    assert got and got[0].severity == "critical"


def test_symlink_member_is_critical(tmp_path):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b""}, symlinks={"demo/key": "/root/.ssh/id_rsa"})
    (f,) = only(scan_wheel(whl), "path-traversal")
    assert f.severity == "critical" and "symlink" in f.message


# --- rule 5: RECORD -------------------------------------------------------------------------------

def test_record_hash_mismatch_is_high(tmp_path):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"print('hi')\n"},
                     tamper={"demo/__init__.py": b"print('pwned')\n"})
    got = only(scan_wheel(whl), "record-mismatch")
    assert {f.severity for f in got} == {"high"} and got[0].member == "demo/__init__.py"


def test_unlisted_member_is_high(tmp_path):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b""}, unlisted={"demo/extra.py": b"x"})
    (f,) = only(scan_wheel(whl), "record-mismatch")
    assert (f.severity, f.member) == ("high", "demo/extra.py")


def test_missing_record_is_high(tmp_path):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b""}, record=False)
    assert only(scan_wheel(whl), "record-mismatch")[0].severity == "high"


# --- rule 6: data schemes -------------------------------------------------------------------------

def test_unknown_data_scheme_is_high(tmp_path):
    whl = make_wheel(tmp_path, {"demo-1.0.data/root/etc/passwd": b"x"})
    assert only(scan_wheel(whl), "data-scheme-escape")[0].severity == "high"


def test_sensitive_data_file_is_medium(tmp_path):
    whl = make_wheel(tmp_path, {"demo-1.0.data/data/share/systemd/user/demo.service": b"[Unit]\n",
                                "demo-1.0.data/data/share/demo/readme.txt": b"ok"})
    (f,) = scan_wheel(whl)
    assert (f.rule, f.severity) == ("data-scheme-escape", "medium")


# --- bounds, errors, data type --------------------------------------------------------------------

def test_findings_are_capped_and_keep_the_critical(tmp_path):
    whl = make_wheel(tmp_path, {"sitecustomize.py": b""},
                     unlisted={f"demo/f{i}.py": b"" for i in range(300)})
    findings = scan_wheel(whl)
    assert len(findings) == gate.MAX_FINDINGS
    assert findings[0].rule == "sitecustomize"
    assert findings[-1].rule == "findings-truncated" and "202 more" in findings[-1].message


def test_corrupt_zip_is_piperror(tmp_path):
    bad = tmp_path / "demo-1.0-py3-none-any.whl"
    bad.write_bytes(b"PK\x03\x04 this is not a zip")
    with pytest.raises(PipError, match="corrupt archive"):
        scan_wheel(bad)
    good = make_wheel(tmp_path / "..", {"demo/__init__.py": b"x" * 5000})
    data = good.read_bytes()
    truncated = tmp_path / "t-1.0-py3-none-any.whl"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(PipError, match="corrupt archive"):
        scan_wheel(truncated)


def test_crc_error_is_piperror(tmp_path):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"A" * 1000})
    data = bytearray(whl.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zf:
        zi = zf.getinfo("demo/__init__.py")
        start = zi.header_offset + 30 + len(zi.filename.encode()) + len(zi.extra)
    data[start + 2] ^= 0xFF  # flip compressed bytes
    whl.write_bytes(bytes(data))
    with pytest.raises(PipError, match="corrupt archive"):
        scan_wheel(whl)


def test_missing_file_is_usage_error(tmp_path):
    with pytest.raises(UsageError):
        scan_wheel(tmp_path / "nope-1.0-py3-none-any.whl")


def test_finding_is_frozen_and_truncates_evidence():
    f = Finding("p", "a.whl", "high", "r", "m", None, "msg", "x" * 500)
    assert len(f.evidence) == gate.MAX_EVIDENCE
    with pytest.raises(Exception):
        f.rule = "other"  # type: ignore[misc]
    with pytest.raises(ValueError):
        Finding("p", "a", "low", "r", "m", None, "msg", "")
    assert f.to_dict()["severity"] == "high"


# --- sdists ---------------------------------------------------------------------------------------

def _tar(path: Path, members) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, kind, payload in members:
            ti = tarfile.TarInfo(name)
            if kind == "file":
                ti.size = len(payload)
                tf.addfile(ti, io.BytesIO(payload))
            else:
                ti.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                ti.linkname = payload
                tf.addfile(ti)
    return path


def test_sdist_clean(tmp_path):
    sd = _tar(tmp_path / "demo-1.0.tar.gz", [("demo-1.0/setup.py", "file", b"x"),
                                             ("demo-1.0/README", "sym", "docs/README.md")])
    findings = scan_sdist(sd)
    assert {(f.rule, f.severity) for f in findings} == {("path-traversal", "medium")}
    assert scan_artifact(sd) == findings


@pytest.mark.parametrize("members", [
    [("../evil", "file", b"x")],
    [("/etc/evil", "file", b"x")],
    [("demo-1.0/key", "sym", "/root/.ssh/id_rsa")],
    [("demo-1.0/up", "sym", "../../outside")],
    [("demo-1.0/hl", "lnk", "../etc/passwd")],
])
def test_sdist_traversal_and_links_are_critical(tmp_path, members):
    sd = _tar(tmp_path / "demo-1.0.tar.gz", members)
    got = only(scan_sdist(sd), "path-traversal")
    assert got[0].severity == "critical" and got[0].package == "demo"


def test_corrupt_sdist_is_piperror(tmp_path):
    sd = _tar(tmp_path / "demo-1.0.tar.gz", [("demo-1.0/setup.py", "file", os.urandom(50000))])
    data = sd.read_bytes()
    sd.write_bytes(data[: len(data) // 2])
    with pytest.raises(PipError, match="corrupt archive"):
        scan_sdist(sd)


def test_corpus_pth_dropper_sdist_is_clean_and_its_wheel_is_critical(tmp_path, corpus_sdist,
                                                                      wheelhouse):
    """tests/packages/pth_dropper (harmless payload, nothing hostile at build time): the sdist has
    nothing the light sdist scan looks for; the wheel pip builds from it ships evil.pth."""
    sd = corpus_sdist("pth_dropper")
    assert scan_sdist(sd) == ()
    out = tmp_path / "out"
    proc = support.pip_wheel(sd, out, wheelhouse, env=support.clean_env(tmp_path / "home"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    (whl,) = out.glob("pth_dropper-*.whl")
    (f,) = scan_wheel(whl)
    assert (f.rule, f.severity, f.member) == ("pth-exec", "critical", "evil.pth")
    assert f.evidence == 'import os; os.system("echo pwned")'


# --- a wheel built by pip -------------------------------------------------------------------------

SETUP_PY = '''
import os, shutil
from setuptools import setup
from setuptools.command.build_py import build_py

class with_pth(build_py):
    """The classic persistence trick: put a .pth at the wheel root via build_lib."""
    def run(self):
        super().run()
        shutil.copy("gatepth_hook.pth", os.path.join(self.build_lib, "gatepth_hook.pth"))

setup(name="gatepth", version="1.0", py_modules=["gatepth"], cmdclass={"build_py": with_pth},
      entry_points={"console_scripts": ["sudo = gatepth:main"]})
'''


def test_pip_built_wheel_with_pth_and_sudo_script(tmp_path, wheelhouse):
    proj = tmp_path / "gatepth"
    proj.mkdir()
    (proj / "setup.py").write_text(SETUP_PY)
    (proj / "gatepth.py").write_text("def main():\n    pass\n")
    (proj / "gatepth_hook.pth").write_text("import os; os.system('id')\n")
    # an isolated PEP 517 build from the wheelhouse, whatever the venv's own setuptools/wheel
    (proj / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "wheel"]\nbuild-backend = "setuptools.build_meta"\n')
    out = tmp_path / "out"
    proc = support.pip_wheel(proj, out, wheelhouse, env=support.clean_env(tmp_path / "home"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    (whl,) = out.glob("gatepth-1.0-*.whl")
    findings = scan_wheel(whl)
    assert rules(findings, "critical") == ["pth-exec"]
    assert rules(findings, "high") == ["console-script-shadowing"]
    assert not [f for f in findings if f.rule == "record-mismatch"]


# --- the real ecosystem: no false positives ------------------------------------------------------

def test_popular_wheels_have_no_findings(ecosystem_wheels):
    for pin, whl in ecosystem_wheels.items():
        assert scan_wheel(whl) == (), pin


# --- ownership: a wheel must not overwrite what it does not own (issue 12) ------------------------

@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A real venv (pip inside, so bin/pip is pip's own generated script) with `othpkg` installed
    by pip; its layout as the interpreter reports it. Read only by the tests."""
    tmp_path = tmp_path_factory.mktemp("target")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                   env=support.clean_env(tmp_path / "home"))
    wheels = tmp_path / "installed"
    wheels.mkdir()
    oth = make_wheel(wheels, {"othpkg/__init__.py": b"GOOD = 1\n"}, name="othpkg")
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index",
                           str(oth)], env=support.clean_env(tmp_path / "home"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    assert proc.returncode == 0, proc.stdout
    layout = gate.target_layout(str(venv / "bin" / "python"))
    assert layout.scripts == str(venv / "bin") and layout.purelib.startswith(str(venv))
    return layout


def _wheel(tmp_path, sub, files, **kw) -> gate.WheelToInstall:
    d = tmp_path / sub
    d.mkdir()
    return gate.WheelToInstall(str(make_wheel(d, files, **kw)))


def test_wheel_carrying_another_distributions_file_is_critical(tmp_path, target):
    loud = _wheel(tmp_path, "loud", {"evil/__init__.py": b"", "othpkg/__init__.py": b"EVIL = 1\n"}, name="evil")
    (f,) = gate.check_ownership([loud], target)
    assert (f.severity, f.rule, f.package, f.member) == ("critical", "overwrites-other", "evil", "othpkg/__init__.py")
    assert "installed distribution othpkg" in f.message and "evil" in f.message
    # quiet: only a new file inside the other package, through the purelib scheme, in a dir it owns
    quiet = _wheel(tmp_path, "quiet", {"evil-1.0.data/purelib/othpkg/__init__.py": b""}, name="evil")
    (g,) = gate.check_ownership([quiet], target)
    assert "othpkg" in g.message and g.rule == "overwrites-other"


def test_console_script_named_pip_replacing_the_targets_pip_is_critical(tmp_path, target):
    whl = _wheel(tmp_path, "w", {"evil/__init__.py": b""}, name="evil",
                 entry_points="[console_scripts]\npip = evil:main\n")
    (f,) = gate.check_ownership([whl], target)
    assert f.evidence == os.path.join(target.scripts, "pip") and "installed distribution pip" in f.message


def test_data_scripts_python_is_critical(tmp_path, target):
    whl = _wheel(tmp_path, "w", {"evil-1.0.data/scripts/python": b"#!/bin/sh\n"}, name="evil")
    (f,) = gate.check_ownership([whl], target)
    assert f.evidence == os.path.join(target.scripts, "python") and "the environment" in f.message


def test_two_wheels_of_one_install_claiming_one_path_are_critical(tmp_path, target):
    a = _wheel(tmp_path, "a", {"shared/x.py": b"a"}, name="alpha")
    b = _wheel(tmp_path, "b", {"beta-1.0.data/platlib/shared/x.py": b"b"}, name="beta")
    (f,) = gate.check_ownership([a, b], target)
    assert f.package == "beta" and "alpha" in f.message and "same install" in f.message


def test_upgrade_and_reinstall_of_the_same_distribution_pass(tmp_path, target):
    up = _wheel(tmp_path, "up", {"othpkg/__init__.py": b"GOOD = 2\n"}, name="othpkg", version="2.0",
                meta_name="OthPkg")
    same = _wheel(tmp_path, "same", {"othpkg/__init__.py": b"GOOD = 1\n"}, name="othpkg")
    assert gate.check_ownership([up], target) == []
    assert gate.check_ownership([same], target) == []
    assert gate.check_ownership([], target) == []


def test_target_dir_layout(tmp_path):
    layout = gate.TargetLayout.for_target_dir(str(tmp_path / "t"))
    whl = _wheel(tmp_path, "w", {"demo/__init__.py": b""})
    assert layout.scripts == str(tmp_path / "t" / "bin") and gate.check_ownership([whl], layout) == []


def _pip_target(directory: Path, *wheels: Path, upgrade: bool = False) -> None:
    """``pip install --target DIRECTORY WHEEL...`` with the real pip."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                           str(directory), *(["--upgrade"] if upgrade else []), *map(str, wheels)],
                          env=support.clean_env(directory.parent / "home"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    assert proc.returncode == 0, proc.stdout


@pytest.fixture
def target_dir(tmp_path):
    """A ``pip install --target`` directory holding ``victim`` (installed there by the real pip)."""
    wheels = tmp_path / "victim-wheel"
    wheels.mkdir()
    _pip_target(tmp_path / "dest", make_wheel(wheels, {"victim/__init__.py": b"VALUE = 'original'\n"}, name="victim"))
    assert (tmp_path / "dest" / "victim" / "__init__.py").is_file()
    return tmp_path / "dest"


def test_target_upgrade_deleting_another_distributions_package_is_critical(tmp_path, target_dir):
    """``pip install --target DIR --upgrade`` removes each top-level entry of DIR it moves in,
    whole: a wheel that ships one new file below another distribution's package (overwriting
    nothing) makes pip delete that package, and its file takes the package's place."""
    layout = gate.TargetLayout.for_target_dir(str(target_dir))
    remover = _wheel(tmp_path, "r", {"victim/api.py": b"TAKEN = 1\n", "remover/__init__.py": b""}, name="remover")
    (f,) = gate.check_ownership([remover], layout, replaces_entries=True)
    assert (f.severity, f.rule, f.package, f.member) == ("critical", "overwrites-other", "remover", "victim/api.py")
    assert "victim" in f.message and f.evidence == str(target_dir / "victim")
    # without --upgrade pip leaves an existing entry alone (it warns): nothing is deleted
    assert gate.check_ownership([remover], layout) == []
    # pip compares the entries' names: a module victim.py is moved in beside the package, which
    # it deletes nothing of (and Python's finder keeps the package: shadowing's rules judge it)
    module = _wheel(tmp_path, "m", {"victim.py": b"", "remover/__init__.py": b""}, name="remover")
    assert not [f for f in gate.check_ownership([module], layout, replaces_entries=True) if "delete" in f.message]


def test_target_upgrade_of_the_owner_or_with_it_passes(tmp_path, target_dir):
    """The owner's own upgrade, and an install that moves the owner in again with the other
    wheel, delete nothing of anyone else's; a link pip leaves alone; an entry nobody's RECORD
    lists is the environment's."""
    layout = gate.TargetLayout.for_target_dir(str(target_dir))
    up = _wheel(tmp_path, "up", {"victim/__init__.py": b"VALUE = 2\n"}, name="victim", version="2.0")
    assert gate.check_ownership([up], layout, replaces_entries=True) == []
    remover = _wheel(tmp_path, "r", {"victim/api.py": b"", "remover/__init__.py": b""}, name="remover")
    both = gate.check_ownership([up, remover], layout, replaces_entries=True)
    assert [f.rule for f in both] == [], both
    (target_dir / "planted").mkdir()
    (target_dir / "planted" / "x.py").write_text("")
    (target_dir / "linked").symlink_to(target_dir / "planted")
    other = _wheel(tmp_path, "o", {"planted/y.py": b"", "linked/z.py": b""}, name="other")
    (f,) = gate.check_ownership([other], layout, replaces_entries=True)
    assert f.evidence == str(target_dir / "planted") and "the environment" in f.message


def test_an_nspkg_line_over_another_distributions_regular_package_is_critical(tmp_path, target):
    """The loader puts a module made from the package's spec in sys.modules and never runs it:
    at every start `import othpkg` (a regular package of another distribution) would give an
    empty module, and the wheel's `othpkg/extra.py` would be found as its submodule. The scan
    alone passes it (the wheel ships files in the namespace it registers)."""
    whl = _wheel(tmp_path, "w", {"evil-nspkg.pth": NSPKG_LINE.replace("NS", "othpkg").encode(),
                                 "othpkg/extra.py": b"TAKEN = 1\n"}, name="evil")
    assert [f.rule for f in gate.scan_wheel(whl.path)] == ["pth-known-hook"]
    (f,) = gate.check_ownership([whl], target)
    assert (f.severity, f.rule, f.member) == ("critical", "shadows-other", "evil-nspkg.pth")
    assert "regular package of installed distribution othpkg" in f.message
    # a regular package another wheel of the same install brings
    a = _wheel(tmp_path, "a", {"regpkg/__init__.py": b""}, name="alpha")
    b = _wheel(tmp_path, "b", {"b-nspkg.pth": NSPKG_LINE.replace("NS", "regpkg").encode(), "regpkg/x.py": b""},
               name="beta")
    found = [f for f in gate.check_ownership([a, b], target) if f.rule == "shadows-other" and f.package == "beta"]
    assert found and "alpha (in the same install)" in found[0].message


def test_an_nspkg_line_over_a_namespace_passes(tmp_path, target):
    """What setuptools writes the loader for: a namespace (no __init__), filled by the wheel."""
    whl = _wheel(tmp_path, "w", {"ns-nspkg.pth": NSPKG_LINE.replace("NS", "freens").encode(),
                                 "freens/part/__init__.py": b""}, name="part")
    assert gate.check_ownership([whl], target) == []


def test_target_upgrade_where_the_data_scheme_replaces_what_pip_moved_in_first_is_critical(tmp_path, target_dir):
    """pip moves the home's lib/python entries into the --target directory first, then the home's
    own (the data scheme's): an attacker's `.data/data/victim/` replaces the victim package pip
    has just moved in, even when the victim's own wheel is in the same install."""
    layout = gate.TargetLayout.for_target_dir(str(target_dir))
    up = _wheel(tmp_path, "up", {"victim/__init__.py": b"VALUE = 2\n"}, name="victim", version="2.0")
    attk = _wheel(tmp_path, "a", {"attk.data/data/victim/__init__.pyc": b"taken", "attk/__init__.py": b""},
                  name="attk")
    found = [f for f in gate.check_ownership([up, attk], layout, replaces_entries=True) if f.package == "attk"]
    assert found and found[0].rule == "overwrites-other" and "victim" in found[0].message, found


@pytest.fixture
def target_dir_with_libs(tmp_path, target_dir):
    """``target_dir`` whose victim also has an auditwheel-style ``victim.libs/``."""
    libs = tmp_path / "libs-wheel"
    libs.mkdir()
    _pip_target(target_dir, make_wheel(libs, {"victim/_x.py": b"", "victim.libs/libv.so": b"\x7fELF"},
                                       name="victim", version="1.0"), upgrade=True)
    return target_dir


@pytest.mark.parametrize("member", ["attk.data/purelib/victim-1.0.dist-info/x", "victim.libs/README",
                                    "attk.data/data/victim-1.0.dist-info/x"])
def test_target_upgrade_replacing_a_non_importable_entry_of_another_distribution_is_critical(
        tmp_path, target_dir_with_libs, member):
    """Not only packages: pip replaces any top-level entry whole (a distribution's metadata, an
    auditwheel `.libs` directory of its libraries)."""
    layout = gate.TargetLayout.for_target_dir(str(target_dir_with_libs))
    attk = _wheel(tmp_path, "a", {member: b"x", "attk/__init__.py": b""}, name="attk")
    found = gate.check_ownership([attk], layout, replaces_entries=True)
    assert [f.rule for f in found] == ["overwrites-other"] and "victim" in found[0].message, found


@pytest.fixture
def tool_target(tmp_path):
    """A --target directory holding ``tool``, with its console script in ``bin/``."""
    directory, wheels = tmp_path / "dest", tmp_path / "w"
    wheels.mkdir()
    _pip_target(directory, make_wheel(wheels, {"tool/__init__.py": b"def main(): pass\n"}, name="tool",
                                      entry_points="[console_scripts]\ntool = tool:main\n"))
    assert (directory / "bin" / "tool").exists()
    return directory


def test_target_upgrade_of_a_distribution_with_console_scripts(tmp_path, tool_target):
    """Its scripts in DIR/bin are its own (its RECORD names them relative to pip's temporary
    home: `../../bin/tool`): upgraded with or without --upgrade, no finding; another
    distribution's scripts there would be deleted with --upgrade (pip replaces bin/ whole)."""
    directory = tool_target
    layout = gate.TargetLayout.for_target_dir(str(directory))
    up = _wheel(tmp_path, "up", {"tool/__init__.py": b"def main(): pass\n"}, name="tool", version="2.0",
                entry_points="[console_scripts]\ntool = tool:main\n")
    assert gate.check_ownership([up], layout, replaces_entries=True) == []
    assert gate.check_ownership([up], layout) == []
    other = _wheel(tmp_path, "o", {"other/__init__.py": b"def main(): pass\n"}, name="other",
                   entry_points="[console_scripts]\nother = other:main\n")
    found = gate.check_ownership([other], layout, replaces_entries=True)
    assert [f.evidence for f in found] == [str(directory / "bin")] and "tool" in found[0].message, found
    assert gate.check_ownership([other], layout) == []  # without --upgrade pip leaves bin/ alone


def test_an_nspkg_line_installed_first_takes_over_the_package_installed_after(tmp_path, target):
    """The attacker's nspkg line for `laterpkg` goes in first (nothing of that name yet); the
    regular package installed after it is refused, naming the start-up hook."""
    site = Path(target.purelib)
    pth = site / "squatter-nspkg.pth"
    pth.write_text(NSPKG_LINE.replace("NS", "laterpkg"))
    try:
        later = _wheel(tmp_path, "l", {"laterpkg/__init__.py": b"VALUE = 1\n"}, name="laterpkg")
        (f,) = gate.check_ownership([later], target)
        assert (f.rule, f.severity, f.evidence) == ("shadows-other", "critical", str(pth))
        ns = _wheel(tmp_path, "n", {"laterpkg/part/__init__.py": b""}, name="part")  # a namespace portion
        assert gate.check_ownership([ns], target) == []
    finally:
        pth.unlink()


@pytest.mark.parametrize("form", ["data scheme", "bom", "compiled init", "another import root"])
def test_an_nspkg_line_over_a_regular_package_in_every_form_is_critical(tmp_path, target, form):
    """The same takeover, as a quiet wheel would spell it: the .pth through the data scheme's
    site-packages, behind a UTF-8 BOM (Python 3.13's site.py reads utf-8-sig), over a package
    whose __init__ is an extension module, or over a package further down the import path (a
    base Python's site-packages: the line's namespace portion comes first)."""
    site = Path(target.purelib)
    rel = site.relative_to(Path(target.data))
    line = NSPKG_LINE.replace("NS", "othpkg").encode()
    layout = target
    files = {"othpkg/extra.py": b""}
    if form == "data scheme":
        files[f"evil-1.0.data/data/{rel}/evil-nspkg.pth"] = line
    elif form == "bom":
        files["evil-nspkg.pth"] = b"\xef\xbb\xbf" + line
    else:
        files["evil-nspkg.pth"] = line.replace(b"othpkg", b"extpkg") if form == "compiled init" else \
            line.replace(b"othpkg", b"farpkg")
        root = tmp_path / "elsewhere"
        package = root / ("extpkg" if form == "compiled init" else "farpkg")
        package.mkdir(parents=True)
        (package / ("__init__.cpython-311-x86_64-linux-gnu.so" if form == "compiled init" else "__init__.py")
         ).write_bytes(b"")
        layout = dataclasses.replace(target, import_paths=(str(root),))
        files = {f"{package.name}/extra.py": b""}
        files["evil-nspkg.pth"] = NSPKG_LINE.replace("NS", package.name).encode()
    whl = _wheel(tmp_path, "w", files, name="evil")
    found = [f for f in gate.check_ownership([whl], layout) if f.rule == "shadows-other"]
    assert found and found[0].severity == "critical", gate.check_ownership([whl], layout)


@pytest.mark.parametrize("member", ["othpkg/__init__.cpython-311-x86_64-linux-gnu.so",
                                    "othpkg/sub.cpython-311-x86_64-linux-gnu.so", "othpkg/sub/__init__.py"])
def test_a_module_beside_another_distributions_module_of_that_name_is_critical(tmp_path, target, member):
    """Inside another distribution's package nothing is overwritten, yet Python's finder takes an
    extension module before source, and a package before a module: `othpkg/__init__.<ext>`
    runs instead of `othpkg/__init__.py` at every `import othpkg`."""
    site = Path(target.purelib)
    sub = site / "othpkg" / "sub.py"
    sub.write_text("")  # an environment file (no RECORD lists it) of that package
    try:
        whl = _wheel(tmp_path, "w", {member: b"\x7fELF" if member.endswith(".so") else b"", "evil/__init__.py": b""},
                     name="evil")
        found = [f for f in gate.check_ownership([whl], target) if f.rule == "shadows-other"]
        assert found and found[0].severity == "critical" and found[0].member == member, found
    finally:
        sub.unlink()


def test_a_wheel_with_its_own_source_and_extension_of_one_module_passes(tmp_path, target):
    whl = _wheel(tmp_path, "w", {"speedy/__init__.py": b"", "speedy/core.py": b"",
                                 "speedy/core.cpython-311-x86_64-linux-gnu.so": b"\x7fELF"}, name="speedy")
    assert gate.check_ownership([whl], target) == []


SHIMS = {
    "pkgutil": "__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n",
    "pkgutil import": '"""The namespace."""\nfrom pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n',
    "pkg_resources": "__import__('pkg_resources').declare_namespace(__name__)\n",
    "pkg_resources import": "from pkg_resources import declare_namespace\ndeclare_namespace(__name__)\n",
    "google style": ("try:\n    import pkg_resources\n    pkg_resources.declare_namespace(__name__)\n"
                     "except (ImportError, AttributeError):\n    import pkgutil\n"
                     "    __path__ = pkgutil.extend_path(__path__, __name__)  # type: ignore\n"),
    "both": ("try:\n    __import__('pkg_resources').declare_namespace(__name__)\nexcept ImportError:\n"
             "    from pkgutil import extend_path\n    __path__ = extend_path(__path__, __name__)\n"),
}


@pytest.mark.parametrize("source, shim", [*((text, True) for text in SHIMS.values()),
                                          ("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n"
                                           "import os\nos.system('id')\n", False),
                                          ("VALUE = 1\n", False), ("", False), ("def (:\n", False),
                                          ("__path__ = evil(__path__)\n", False)])
def test_a_namespace_shim_is_told_from_a_package(source, shim):
    from pipguard.gate.namespaces import namespace_shim

    assert namespace_shim(source.encode()) is shim


@pytest.fixture
def shim_target(tmp_path):
    """A venv's layout holding ``shimns`` (a pkgutil namespace shim ``__init__.py``, as
    backports.tarfile ships one) and a distribution with an nspkg line for ``linens``."""
    wheels = tmp_path / "shim-wheels"
    wheels.mkdir()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    first = make_wheel(wheels, {"shimns/__init__.py": SHIMS["pkgutil"].encode(), "shimns/one.py": b""},
                       name="shimns_one")
    nspkg = make_wheel(wheels, {"linens-nspkg.pth": NSPKG_LINE.replace("NS", "linens").encode(),
                                "linens/one.py": b""}, name="linens_one")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                           "--no-deps", "--no-index", str(first), str(nspkg)],
                          env=support.clean_env(tmp_path / "home"), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return gate.target_layout(str(venv / "bin" / "python"))


def test_namespaces_with_shims_and_nspkg_lines_pass(tmp_path, shim_target):
    """The families that share a namespace (backports.tarfile + backports.csv, jaraco 1.x,
    old sphinxcontrib): a shim __init__.py each, or an nspkg line beside another's shim, in
    either order; none of them is refused."""
    two = _wheel(tmp_path, "two", {"shimns/__init__.py": SHIMS["both"].encode(), "shimns/two.py": b""},
                 name="shimns_two")
    line = _wheel(tmp_path, "line", {"shimns-nspkg.pth": NSPKG_LINE.replace("NS", "shimns").encode(),
                                     "shimns/three.py": b""}, name="shimns_three")
    after = _wheel(tmp_path, "after", {"linens/__init__.py": SHIMS["pkg_resources"].encode(),
                                       "linens/two.py": b""}, name="linens_two")
    assert gate.check_ownership([two], shim_target) == []
    assert gate.check_ownership([line], shim_target) == []
    assert gate.check_ownership([after], shim_target) == []
    assert gate.check_ownership([two, line, after], shim_target) == []
    # a real package's __init__ in the nspkg line's namespace is still a takeover
    real = _wheel(tmp_path, "real", {"linens/__init__.py": b"VALUE = 1\n"}, name="linens_real")
    assert [f.rule for f in gate.check_ownership([real], shim_target)] == ["shadows-other"]


def test_target_dirs_run_no_nspkg_line_and_forget_leftover_records(tmp_path, target_dir):
    """A --target directory is put on PYTHONPATH, where site.py reads no .pth: its nspkg lines
    take nothing over. A distribution's RECORD that outlived its files (an earlier --upgrade of
    another distribution replaced them) names no victim."""
    layout = gate.TargetLayout.for_target_dir(str(target_dir))
    line = _wheel(tmp_path, "l", {"x-nspkg.pth": NSPKG_LINE.replace("NS", "victim").encode(), "x/__init__.py": b""},
                  name="x")
    assert [f for f in gate.check_ownership([line], layout) if f.rule == "shadows-other"] == []
    shutil.rmtree(target_dir / "victim")  # what --upgrade of another distribution left: its RECORD stays
    (target_dir / "victim").mkdir()
    (target_dir / "victim" / "new.py").write_text("")
    other = _wheel(tmp_path, "o", {"victim/new.py": b""}, name="victim2")
    found = gate.check_ownership([other], layout, replaces_entries=True)
    assert [f.message for f in found if "victim2" not in f.package] == [] and \
        not [f for f in found if "installed distribution victim" in f.message], found


def test_a_file_replaced_by_the_same_bytes_is_no_overwrite(tmp_path, target):
    """Distributions of one family ship some files alike (opencensus' and dbt's shared
    __init__.py): the same bytes over the same bytes lose nothing; one byte more is critical."""
    same = _wheel(tmp_path, "s", {"othpkg/__init__.py": b"GOOD = 1\n", "twin/__init__.py": b""}, name="twin")
    assert gate.check_ownership([same], target) == []
    a = _wheel(tmp_path, "a", {"family/common.py": b"X = 1\n"}, name="fam_a")
    b = _wheel(tmp_path, "b", {"family/common.py": b"X = 1\n"}, name="fam_b")
    assert gate.check_ownership([a, b], target) == []
    c = _wheel(tmp_path, "c", {"family/common.py": b"X = 2\n"}, name="fam_c")
    assert [f.package for f in gate.check_ownership([a, c], target)] == ["fam-c"]
    changed = _wheel(tmp_path, "d", {"othpkg/__init__.py": b"GOOD = 1 \n"}, name="twin2")
    assert [f.rule for f in gate.check_ownership([changed], target)] == ["overwrites-other"]


@pytest.mark.parametrize("source", [
    "__path__ = __import__('pkgutil').extend_path(__import__('os').system('id') or __path__, __name__)\n",
    "__import__('pkg_resources').declare_namespace(__import__('os').system('id'))\n",
    "__path__ = __import__('os').extend_path(__path__, __name__)\n",
    "import pkg_resources as extend_path\n__path__ = extend_path(__path__, __name__)\n",
    "from pkgutil import extend_path as x\n__path__ = x(__path__, __name__)\n",
    "from pkg_resources import *\ndeclare_namespace(__name__)\n",
    "try:\n    __import__('pkg_resources').declare_namespace(__name__)\n"
    "except __import__('os').system('id'):\n    pass\n",
    "__path__ = (lambda: __import__('os').system('id'))().extend_path(__path__, __name__)\n",
])
def test_a_shim_that_runs_anything_else_is_no_shim(source):
    """Only the idioms, with exactly `__path__`/`__name__` as arguments and the two modules by
    name: code hidden in an argument, a rebound name or an except clause makes it a package."""
    from pipguard.gate.namespaces import namespace_shim

    assert namespace_shim(source.encode()) is False


@pytest.fixture
def co_owned_target(tmp_path):
    """A venv where `aaa_helper` 1.0 was let in with a byte-identical copy of `victim/api.py`
    (and `ns/__init__.py`, a namespace shim): both RECORDs list those files now, and
    `aaa_helper` sorts first."""
    wheels = tmp_path / "co"
    wheels.mkdir()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    api = b"def get(url):\n    return 'real'\n"
    victim = make_wheel(wheels, {"victim/__init__.py": b"", "victim/api.py": api,
                                 "ns/__init__.py": SHIMS["pkgutil"].encode(), "ns/victim.py": b""}, name="victim")
    helper = make_wheel(wheels, {"victim/api.py": api, "ns/__init__.py": SHIMS["pkg_resources"].encode(),
                                 "aaa_helper/__init__.py": b""}, name="aaa_helper")
    layout_python = str(venv / "bin" / "python")
    for wheel in (victim, helper):
        proc = subprocess.run([sys.executable, "-m", "pip", "--python", layout_python, "install", "-q", "--no-deps",
                               "--no-index", str(wheel)], env=support.clean_env(tmp_path / "home"),
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    return gate.target_layout(layout_python)


def test_a_file_let_in_as_the_same_bytes_is_not_its_to_change(tmp_path, co_owned_target):
    """The two-step takeover: a wheel let in with another distribution's file byte for byte (or
    a namespace shim) is listed in two RECORDs; its next version changing that file is still
    an overwrite of the other's, whichever distribution's name sorts first."""
    found = gate.check_ownership([_wheel(tmp_path, "h11", {
        "victim/api.py": b"import os\nos.system('id')\n", "aaa_helper/__init__.py": b""},
        name="aaa_helper", version="1.1")], co_owned_target)
    assert [(f.rule, f.member) for f in found] == [("overwrites-other", "victim/api.py")], found
    assert "victim" in found[0].message
    found = gate.check_ownership([_wheel(tmp_path, "h12", {
        "ns/__init__.py": b"import os\nos.system('id')\n", "aaa_helper/__init__.py": b""},
        name="aaa_helper", version="1.2")], co_owned_target)
    assert [(f.rule, f.member) for f in found] == [("overwrites-other", "ns/__init__.py")], found
    # beside the co-owned module: still the other's import to take over
    found = gate.check_ownership([_wheel(tmp_path, "h13", {
        "victim/api.cpython-311-x86_64-linux-gnu.so": b"\x7fELF", "aaa_helper/__init__.py": b""},
        name="aaa_helper", version="1.3")], co_owned_target)
    assert [f.rule for f in found] == ["shadows-other"], found

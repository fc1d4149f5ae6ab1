"""Issue 13's "done when", in small: builds of the real ecosystem's backends install with zero
refusals under ``pipguard install --sandbox``, the same builds reading a credential still refuse.

Each false alarm found by installing from PyPI as a new user (docs/sandbox.md, "The real
ecosystem") has its test here, with the environment that showed it: no
``PYTHONDONTWRITEBYTECODE`` (the rest of the suite sets it, which hid two of them), a PATH
toolchain in the home, the real meson-python / meson / ninja / maturin wheels (fetched once into
the test cache: support/buildtools.py) served by a loopback index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import textwrap
from pathlib import Path

import pytest

from support import build_sdist, requires, strict
from support.pipinstall import Route, pg_install
from support.projects import write_project

pytestmark = [requires("linux"), requires("landlock", abi=6), requires("seccomp_user_notif")]

#: the environment of a user who never set it (the suite's clean_env sets it to 1)
BYTECODE_ON = {"PYTHONDONTWRITEBYTECODE": None}


@pytest.fixture
def index(buildtools, wheelhouse, tmp_path):
    route = Route("index", [buildtools, wheelhouse])
    route.add(tmp_path / "dist")
    yield route
    route.stop()


def sdist(src: Path, dist: Path, name: str, version: str) -> Path:
    """``src`` as ``dist/NAME-VERSION.tar.gz`` (one top directory, as sdists have)."""
    out = dist / f"{name}-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname=f"{name}-{version}")
    return out


MESON_BUILD = """\
project('{name}', 'c', version: '0.1.0')
py = import('python').find_installation(pure: false)
# an optional dependency: meson searches pkg-config and CMake, deriving a prefix from each
# PATH entry and listing it (the toolchain-prefix lookup)
dependency('pipguard-absent-dependency', required: false)
{extra}
py.extension_module('{name}', '{name}.c', install: true)
"""
HELLO_C = """\
#include <Python.h>
static struct PyModuleDef mod = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&mod); }}
"""
# what a hostile meson.build does: run a program that reads the user's key
STEAL = ("run_command(py, '-c', 'import os; print(open(os.path.expanduser(\"~/.ssh/id_rsa\"))"
         ".read())', check: false)")


def meson_project(root: Path, name: str, extra: str = "") -> Path:
    src = root / name
    src.mkdir(parents=True)
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["meson-python", "ninja"]
        build-backend = "mesonpy"

        [project]
        name = "{name}"
        version = "0.1.0"
        """))
    (src / "meson.build").write_text(MESON_BUILD.format(name=name, extra=extra))
    (src / f"{name}.c").write_text(HELLO_C.format(name=name))
    return src


def toolchain_in(home: Path) -> Path:
    """A PATH toolchain in the (fake) home, with a credential file beside it, as rustup's is."""
    bindir = home / ".cargo" / "bin"
    bindir.mkdir(parents=True)
    (home / ".cargo" / "credentials.toml").write_text('[registry]\ntoken = "PIPGUARD-FAKE-cargo"\n')
    return bindir


def findings(report: dict) -> list:
    return [(e["rule"], e["target"]) for e in report["events"] if e["severity"] == "finding"]


@requires("gcc")
def test_meson_python_sdist_installs_clean_with_a_home_toolchain_on_path(
        tmp_path, fake_home, any_pip_target, index):
    """Three false alarms of a meson-python sdist, each refused the install before its fix:
    pip <= 25's build environment has a ``sitecustomize.py`` without bytecode (hook calls
    tried to cache it: ``write-outside-roots``); mesonpy has no prepare-metadata hook, so
    pyproject-hooks builds the wheel there and build_wheel copies it from the metadata's
    parent (``foreign-read``); meson's CMake search lists ``~/.cargo`` for a ``~/.cargo/bin``
    on PATH (``home-read``). meson also looks up ``~/.netrc`` (information). The native reads
    are the plain backend's evidence (read observation on): this runs it (``--isolation os``);
    under ns they are not observed, so they cannot raise these alarms there."""
    src = meson_project(tmp_path / "src", "pgmesonhello")
    sdist(src, tmp_path / "dist", "pgmesonhello", "0.1.0")
    bindir = toolchain_in(fake_home.path)
    path = f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    proc, report = pg_install(["--isolation", "os", "pgmesonhello"], home=fake_home, target=any_pip_target, route=index,
                              cwd=tmp_path, extra_env=dict(BYTECODE_ON, PATH=path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert report["verdict"] == "clean" and not findings(report), findings(report)
    ran = subprocess.run([str(any_pip_target / "bin" / "python"), "-c", "import pgmesonhello"],
                         capture_output=True, text=True, cwd="/")
    assert ran.returncode == 0, ran.stderr
    info = {(e["rule"], e["target"]) for e in report["events"] if e["severity"] == "info"}
    assert any(rule == "config-lookup" and target.endswith("/.netrc") for rule, target in info), info
    if shutil.which("cmake", path=path):  # meson lists PATH prefixes only on its CMake route
        assert ("toolchain-prefix", str(fake_home.path / ".cargo")) in info, info
    hooks = [p["name"] for p in report["phases"] if p["package"] == "pgmesonhello"]
    assert "build_wheel" in hooks, hooks


@requires("gcc")
def test_meson_build_reading_a_key_still_refuses(tmp_path, fake_home, target, index):
    """The same backend and toolchain, and a meson.build that runs a program reading
    ``~/.ssh/id_rsa``: refused, reported, nothing installed."""
    src = meson_project(tmp_path / "src", "pgmesonsteal", extra=STEAL)
    sdist(src, tmp_path / "dist", "pgmesonsteal", "0.1.0")
    bindir = toolchain_in(fake_home.path)
    path = f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    proc, report = pg_install(["pgmesonsteal"], home=fake_home, target=target, route=index,
                              cwd=tmp_path, extra_env=dict(BYTECODE_ON, PATH=path))
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert report["verdict"] == "blocked"
    assert any(rule in ("secret-read", "decoy-read") and target.endswith("/.ssh/id_rsa")  # decoy: ns
               for rule, target in findings(report)), findings(report)
    assert not list((target / "lib").glob("python*/site-packages/pgmesonsteal*"))
    for marker in fake_home.markers.values():
        assert marker not in proc.stdout + proc.stderr


def test_rust_sdist_with_maturin_and_no_crates_installs_clean(tmp_path, fake_home, target, index):
    """A Rust binary built by maturin from an sdist, with cargo from PATH: on this kind of
    machine rustup's ``~/.cargo/bin`` lies under the real home (the toolchain case of issue
    13). The test's HOME is fake, so the toolchain is found through PATH only."""
    cargo = shutil.which("cargo")
    if not cargo:
        if strict():
            pytest.fail("cargo is not on PATH", pytrace=False)
        pytest.skip("cargo is not on PATH")
    src = tmp_path / "src" / "pgrusthello"
    (src / "src").mkdir(parents=True)
    (src / "Cargo.toml").write_text('[package]\nname = "pgrusthello"\nversion = "0.1.0"\n'
                                    'edition = "2021"\n\n[dependencies]\n')
    (src / "src" / "main.rs").write_text('fn main() { println!("rust-hello-ran"); }\n')
    (src / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["maturin>=1,<2"]
        build-backend = "maturin"

        [project]
        name = "pgrusthello"
        version = "0.1.0"

        [tool.maturin]
        bindings = "bin"
        """))
    sdist(src, tmp_path / "dist", "pgrusthello", "0.1.0")
    proc, report = pg_install(["pgrusthello"], home=fake_home, target=target, route=index,
                              cwd=tmp_path, extra_env=BYTECODE_ON, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert report["verdict"] == "clean" and not findings(report), findings(report)
    ran = subprocess.run([str(target / "bin" / "pgrusthello")], capture_output=True, text=True)
    assert ran.stdout.strip() == "rust-hello-ran", ran.stderr


def test_probe_imports_of_a_clean_package_with_bytecode_caching_on(tmp_path, fake_home, target,
                                                                    links):
    """``--probe-imports`` stages the wheels read-only; Python's import system tried to cache
    bytecode there, and every probe was refused (``write-outside-roots``)."""
    proc, report = pg_install(["--probe-imports", "legit_pure"], home=fake_home, target=target,
                              route=links, cwd=tmp_path, extra_env=BYTECODE_ON, command="sandbox")
    assert proc.returncode == 0, proc.stderr[-4000:]
    probes = [p for p in report["phases"] if p["name"] == "probe"]
    assert probes and report["verdict"] == "clean", findings(report)


# setuptools-scm's discovery (vcs_versioning): each parent of the source tree is listed for an
# ``*.egg-info`` holding a version, each discovery factory inside ``except Exception``
SCM_WALK = '''
import pathlib
for parent in pathlib.Path.cwd().resolve().parents:
    try:
        [p for p in parent.iterdir() if p.name.endswith(".egg-info") and p.is_dir()]
    except Exception:
        pass  # vcs-versioning goes on: Landlock refuses the listing on the plain backend
'''
PEEK = '''
import os
try:
    open(os.environ["PIPGUARD_TEST_SIBLING"]).read()
except OSError:
    pass
'''


def test_scm_walk_up_from_the_build_tree_installs_clean(tmp_path, fake_home, target, links, backend):
    """Issue 29: setuptools-scm lists the parents of the source tree (``pip-install-XXXX``,
    ``/tmp``, ``/``) looking for egg-info; each was a ``foreign-read`` (pip's temp area is the
    hook calls' private root) and the install was refused, under ns and the plain backend."""
    extra = links.add(tmp_path / "extra")
    proj = write_project(tmp_path / "p", "pgscmwalk")
    (proj / "setup.py").write_text(SCM_WALK + (proj / "setup.py").read_text())
    build_sdist(proj, extra)
    proc, report = pg_install([*backend.install_args, "pgscmwalk"], home=fake_home, target=target,
                              route=links, cwd=tmp_path, extra_env=BYTECODE_ON)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert report["verdict"] == "clean" and not findings(report), findings(report)
    assert [p["name"] for p in report["phases"] if p["package"] == "pgscmwalk"], report["phases"]


def test_reading_inside_another_tree_of_the_temp_area_still_refuses(tmp_path, fake_home, target,
                                                                     links, backend):
    """The same walk, then a read of a file in another directory of pip's temp area (what a
    sibling build's tree is; here one the test made in ``/tmp``): refused and reported
    (``foreign-read``), the install refused. The listings above are no licence to read."""
    extra = links.add(tmp_path / "extra")
    sibling = Path(tempfile.mkdtemp(prefix="pgsibling-", dir="/tmp"))
    try:
        (sibling / "setup.py").write_text("# another build's tree\n")
        os.chmod(sibling, 0o755)
        proj = write_project(tmp_path / "p", "pgscmpeek")
        (proj / "setup.py").write_text(SCM_WALK + PEEK + (proj / "setup.py").read_text())
        build_sdist(proj, extra)
        proc, report = pg_install([*backend.install_args, "--keep-env", "PIPGUARD_TEST_SIBLING",
                                   "pgscmpeek"], home=fake_home, target=target, route=links,
                                  cwd=tmp_path, extra_env=dict(
                                      BYTECODE_ON, PIPGUARD_TEST_SIBLING=str(sibling / "setup.py")))
    finally:
        shutil.rmtree(sibling)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert findings(report) and all(rule == "foreign-read" for rule, _ in findings(report)), \
        findings(report)
    assert ("foreign-read", str(sibling / "setup.py")) in findings(report)

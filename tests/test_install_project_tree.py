"""A build writing into the user's own project (issue 33): ``pip install ./proj`` and ``-e .``
build the project in place, its tree writable by the build — and what the build leaves there
outlives the install. Files another program runs later (``conftest.py``, ``.vscode/tasks.json``,
a ``Makefile``, a repository's hooks in a subdirectory) and start-up files on an editable
install's import path (``sitecustomize``, ``usercustomize``, ``.pth``) refuse the install, are
reported, and are undone; everything else the build created or changed is only reported.

Each attack is planted in its loud form (Python's ``open()``, seen by the audit hook) and its
quiet form (``sh -c 'printf ... > FILE'``: no audit event at all), with real pip (the venv's
bundled one and the newest), from the project's path.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import pytest
from packaging.utils import canonicalize_name

from support import gatewheels
from support.pipinstall import listing, pg_install, pip_list, site_import
from support.projects import pyproject, write_project

#: class -> (the file the build plants, relative to the project; -e or not; the existing content
#: of that file before the build, or None: the build creates it; the rules that may report it)
PLANTS = {
    "conftest": ("tests/conftest.py", False, None, {"project-run-later"}),
    "vscode-task": (".vscode/tasks.json", False, None, {"project-run-later"}),
    "makefile-edit": ("Makefile", False, "test:\n\tpytest\n", {"project-run-later"}),
    "subdir-git-hook": ("vendor/lib/.git/hooks/post-checkout", False, None, {"project-run-later"}),
    "sitecustomize": ("sitecustomize.py", True, None, {"sitecustomize"}),
    "usercustomize-package": ("src/usercustomize/__init__.py", True, None, {"usercustomize"}),
    "pth": ("src/zz-planted.pth", True, None, {"pth-exec"}),
    # attacked (issue 33/29): each was only an informational "created" (or a medium "changed")
    "subdir-gitdir-file": ("vendor/lib/.git", False, None, {"project-run-later"}),
    "husky-hook": (".husky/pre-commit", False, "npx lint-staged\n", {"project-run-later"}),
    "pytest-plugin-metadata": ("src/zzplug-1.0.dist-info/entry_points.txt", True, None, {"project-run-later"}),
}
PAYLOAD = "import os; os.system('touch /tmp/pipguard-projtree-never')\n"

LOUD = """
import os
os.makedirs(os.path.dirname({rel!r}) or '.', exist_ok=True)
with open({rel!r}, 'w') as handle:
    handle.write({payload!r})
"""
# no Python file API at all: a shell writes it (the audit hook sees only the exec)
QUIET = """
import subprocess
subprocess.run(['sh', '-c', 'mkdir -p "$(dirname "$1")" && printf "%s" "$2" > "$1"', 'sh', {rel!r},
                {payload!r}], check=False)
"""


def _project(tmp_path, name, how, rel):
    proj = write_project(tmp_path, name)
    src = proj / "src"
    src.mkdir()
    (proj / "setup.py").write_text(textwrap.dedent(f"""\
        from setuptools import setup
        setup(name={name!r}, version='1.0', packages=[{name!r}], package_dir={{'': 'src'}})
        """))
    shutil.move(str(proj / name), str(src / name))
    (proj / "tests").mkdir()
    (proj / "tests" / "test_it.py").write_text("def test_it():\n    pass\n")
    plant = (LOUD if how == "loud" else QUIET).format(rel=rel, payload=PAYLOAD)
    (proj / "setup.py").write_text(plant + (proj / "setup.py").read_text())
    return proj


def _findings(report, name):
    (pkg,) = [p for p in report["packages"] if p["name"] == name]
    return pkg["findings"]


@pytest.mark.parametrize("how", ["loud", "quiet"])
@pytest.mark.parametrize("what", sorted(PLANTS))
def test_a_file_planted_in_the_project_is_refused_reported_and_undone(tmp_path, fake_home, links, any_pip_target,
                                                                      what, how):
    """Before: the build wrote it, the install went through, nothing said so; the file ran at
    the user's next ``pytest``/``make``/``git checkout``/VS Code task or interpreter start."""
    rel, editable, existing, rules = PLANTS[what]
    name = "plant" + what.replace("-", "")
    proj = _project(tmp_path, name, how, rel)
    planted = proj / rel
    if existing is not None:
        planted.parent.mkdir(parents=True, exist_ok=True)
        planted.write_text(existing)
    if what == "subdir-git-hook":  # a vendored repository inside the project
        (proj / "vendor" / "lib" / ".git" / "hooks").mkdir(parents=True)
        (proj / "vendor" / "lib" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    before = listing(any_pip_target)
    proc, report = pg_install(["-e", "."] if editable else ["."], home=fake_home, target=any_pip_target,
                              route=links, cwd=proj)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(any_pip_target) == before
    assert name not in pip_list(any_pip_target)
    findings = _findings(report, name)
    hits = [f for f in findings if f["rule"] in rules and f["member"] == str(planted)]
    assert hits and all(f["severity"] == "critical" for f in hits), findings
    assert any(r["package"] == name and r["kind"] == "output" for r in report["refusals"]), report["refusals"]
    # undone: what the build created is gone, what it changed is as the user had it
    if existing is None:
        assert not planted.exists()
    else:
        assert planted.read_text() == existing
    assert not os.path.exists("/tmp/pipguard-projtree-never")


def _honest_setuptools(tmp_path):
    proj = write_project(tmp_path, "honestst")
    (proj / "conftest.py").write_text("")  # the user's own: the build leaves it alone
    return proj


def _honest_hatchling(tmp_path):
    proj = tmp_path / "honesthatch"
    (proj / "src" / "honesthatch").mkdir(parents=True)
    (proj / "src" / "honesthatch" / "__init__.py").write_text("VALUE = 1\n")
    (proj / "pyproject.toml").write_text(pyproject("honesthatch", "hatchling", "hatchling.build"))
    (proj / "Makefile").write_text("test:\n\tpytest\n")
    return proj


@pytest.mark.parametrize("backend", ["setuptools", "hatchling"])
def test_an_honest_editable_install_is_not_a_false_alarm(tmp_path, fake_home, links, any_pip_target, buildtools,
                                                         backend):
    """`pip install -e .` of an honest project: installed as pip installs it, no finding above
    informational; setuptools' egg-info and build/ are not reported."""
    links.add(buildtools)
    if backend == "hatchling":  # its build_editable asks for `editables`
        try:
            (wheel,) = gatewheels.fetch(["editables==0.5"]).values()
        except gatewheels.GateWheelsUnavailable as exc:
            pytest.skip(str(exc))
        shutil.copy(wheel, links.add(tmp_path / "editables"))
    proj = (_honest_setuptools if backend == "setuptools" else _honest_hatchling)(tmp_path)
    name = proj.name
    proc, report = pg_install(["-e", "."], home=fake_home, target=any_pip_target, route=links, cwd=proj)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pip_list(any_pip_target).get(name) == "1.0"
    assert site_import(any_pip_target, name).returncode == 0
    findings = _findings(report, name)
    assert all(f["severity"] == "info" for f in findings), findings
    reported = [f["member"] for f in findings if f["rule"].startswith("project-")]
    assert not [m for m in reported if ".egg-info" in m or "/build/" in m], reported


def test_what_a_build_creates_or_changes_in_the_project_is_reported(tmp_path, fake_home, links, target):
    """An ordinary file the build created (a generated source, an extension built in place) is
    reported as informational; a file of the user's that it changed, as medium — and neither
    refuses (setuptools-scm rewrites its version file, Cython regenerates a tracked .c)."""
    proj = write_project(tmp_path, "reporter")
    (proj / "reporter" / "_version.py").write_text("version = '0.0'\n")
    (proj / "setup.py").write_text(textwrap.dedent("""\
        import subprocess
        open('reporter/_version.py', 'w').write("version = '1.0'\\n")  # as setuptools-scm does
        subprocess.run(['sh', '-c', 'printf x > reporter/_generated.c'])
        """) + (proj / "setup.py").read_text())
    proc, report = pg_install(["."], home=fake_home, target=target, route=links, cwd=proj)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert site_import(target, "reporter").returncode == 0
    by_member = {(f["rule"], f["severity"], f["member"]) for f in _findings(report, "reporter")}
    assert ("project-file-changed", "medium", str(proj / "reporter" / "_version.py")) in by_member, by_member
    assert ("project-file-created", "info", str(proj / "reporter" / "_generated.c")) in by_member, by_member
    assert not [m for r, s, m in by_member if ".egg-info" in m or "/build/" in m], by_member
    assert json.loads((tmp_path / "reporter" / "install-report.json").read_text())["status"] == "installed"


def test_an_honest_pytest_plugin_declaring_its_name_is_not_a_false_alarm(tmp_path, fake_home, links, any_pip_target,
                                                                          buildtools):
    """setuptools writes the project's own egg-info (its pytest11 entry point in it) into the
    tree: named as pyproject.toml names the project (normalised), it is not another
    distribution's metadata."""
    links.add(buildtools)
    proj = tmp_path / "honestplug"
    (proj / "honest_plug").mkdir(parents=True)
    (proj / "honest_plug" / "__init__.py").write_text("VALUE = 1\n")
    (proj / "pyproject.toml").write_text(pyproject(
        "Honest.Plug", "setuptools", "setuptools.build_meta",
        tail='[tool.setuptools]\npackages = ["honest_plug"]\n\n'
             '[project.entry-points.pytest11]\nhonest_plug = "honest_plug"\n'))
    proc, report = pg_install(["-e", "."], home=fake_home, target=any_pip_target, route=links, cwd=proj)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {canonicalize_name(k): v for k, v in pip_list(any_pip_target).items()}.get("honest-plug") == "1.0"
    assert site_import(any_pip_target, "honest_plug").returncode == 0
    assert list(proj.glob("*.egg-info/entry_points.txt")), list(proj.iterdir())
    findings = _findings(report, "honest-plug")
    assert all(f["severity"] == "info" for f in findings), findings


def test_a_build_rewriting_the_users_release_wheel_is_refused(tmp_path, fake_home, links, target):
    """The wheel the user built for the next upload, rewritten in place with its size and mtime
    put back (quietly: a shell's dd, no Python file API). Before: dist/ was not looked at, the
    install went through and nothing said so."""
    proj = write_project(tmp_path, "relwheel")
    wheel = proj / "dist" / "relwheel-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK-honest-wheel-bytes")
    (proj / "setup.py").write_text(textwrap.dedent("""\
        import subprocess
        subprocess.run(['sh', '-c', 'f=dist/relwheel-1.0-py3-none-any.whl; mkdir -p build; touch -r "$f" build/ts; '
                        'printf PK-evil-wheel-bytes!! | dd of="$f" conv=notrunc status=none; touch -r build/ts "$f"'])
        """) + (proj / "setup.py").read_text())
    before, mtime = listing(target), wheel.stat().st_mtime_ns
    proc, report = pg_install(["."], home=fake_home, target=target, route=links, cwd=proj)
    # the attack as made: same size, same mtime, other bytes (left as the build made them: reported)
    assert wheel.read_bytes() == b"PK-evil-wheel-bytes!!" and wheel.stat().st_mtime_ns == mtime
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    hits = [f for f in _findings(report, "relwheel") if f["rule"] == "project-release-changed"]
    assert hits and hits[0]["severity"] == "high" and hits[0]["member"] == str(wheel), _findings(report, "relwheel")


def test_a_link_out_of_the_project_is_refused_and_removed(tmp_path, fake_home, links, target):
    """The build links package data to the user's SSH key (a shell's ``ln -s``: no audit event,
    nothing read): the next unsandboxed ``python -m build`` would pack the key into the wheel the
    user uploads. Before: an informational "created"."""
    key = fake_home.path / ".ssh" / "id_rsa"
    proj = write_project(tmp_path, "linkout")
    data = proj / "linkout" / "data.txt"
    (proj / "setup.py").write_text(textwrap.dedent(f"""\
        import subprocess
        subprocess.run(['ln', '-s', {str(key)!r}, {str(data)!r}])
        """) + (proj / "setup.py").read_text())
    proc, report = pg_install(["."], home=fake_home, target=target, route=links, cwd=proj)
    assert proc.returncode == 1, proc.stderr[-3000:]
    hits = [f for f in _findings(report, "linkout") if f["rule"] == "project-run-later" and f["member"] == str(data)]
    assert hits and hits[0]["severity"] == "critical", _findings(report, "linkout")
    assert not os.path.lexists(data) and key.exists()

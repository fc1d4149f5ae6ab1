"""``pipguard install --sandbox`` is pip: local projects, extras, ``-e``, ``-r`` with relative
paths and ``-e`` lines, installed versions kept, ``--target``/``--prefix``, dynamic build
requirements, quoted markers — with every hook call in its own sandbox, on both routes (a
loopback index with credentials in PIP_INDEX_URL, and --find-links) and with two pips.
Attacks at the seam: a build that rewrites a sibling's tree or drops a wheel next to its own, and
one that looks for the index credentials everywhere it can."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import build_sdist
from support.pipinstall import Route, listing, pg_install, pip_list, site_import
from support.projects import BACKEND, write_flit_project, write_project


# --------------------------------------------------------------------------- local projects
def test_local_project_dot_with_extras(tmp_path, fake_home, route, any_pip_target):
    target = any_pip_target
    proj = write_flit_project(tmp_path, "localproj", extras={"x": ["light_pure"]})
    proc, report = pg_install([".[x]"], home=fake_home, target=target, route=route, cwd=proj)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = pip_list(target)
    assert installed.get("localproj") == "1.0" and "light-pure" in installed, installed
    assert site_import(target, "localproj").returncode == 0
    hooks = {(p["package"], p["name"]) for p in report["phases"]}
    assert ("localproj", "build_wheel") in hooks and ("light-pure", "build_wheel") in hooks, hooks
    # each package lists its own hook calls
    (own,) = [p for p in report["packages"] if p["name"] == "localproj"]
    assert [c["name"] for c in own["hook_calls"]] == [p["name"] for p in report["phases"]
                                                     if p["package"] == "localproj"]
    assert "build_wheel" in [c["name"] for c in own["hook_calls"]], own


def test_the_oldest_claimed_pip_is_the_one_tested(tmp_path, wheelhouse):
    """docs/sandbox.md claims 23.2 as the oldest pip supported, tested as the venvs' bundled pip:
    that holds only where the test interpreter bundles 23.2 (CPython 3.11, what CI runs)."""
    from support.pipinstall import make_venv

    venv = make_venv(tmp_path / "v", "bundled", wheelhouse)
    version = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"],
                             capture_output=True, text=True).stdout.split()[1]
    if sys.version_info[:2] != (3, 11):
        pytest.skip(f"Python {sys.version_info[0]}.{sys.version_info[1]} bundles pip {version}: the oldest "
                    "claimed pip (23.2) is tested on CPython 3.11")
    assert version.startswith("23.2"), version


def test_absolute_path_installs_the_project(tmp_path, fake_home, route, target):
    """The old pipguard printed INSTALLED and installed only the dependencies."""
    proj = write_flit_project(tmp_path, "abspathproj")
    proc, report = pg_install([str(proj)], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pip_list(target).get("abspathproj") == "1.0"
    assert [p["name"] for p in report["packages"]] == ["abspathproj"]


def test_no_run_directory_outlives_the_install(tmp_path, fake_home, links, target):
    """Each hook call's run directory is removed while pip works on (deferred cleanup): none may
    be left once pipguard exits, the last call's included, whether the install passed or not.
    A TMPDIR this long also puts the seam's socket elsewhere (below it, the socket's path would
    not fit in a unix socket address: that was exit 2, "AF_UNIX path too long")."""
    proj = write_flit_project(tmp_path, "tidyproj")
    bad = write_flit_project(tmp_path, "untidyproj", dependencies=["no_such_dist_pg"])
    tmp = tmp_path / "tmpdir"
    for project, ok in ((proj, True), (bad, False)):
        tmp.mkdir()
        proc, report = pg_install([str(project)], home=fake_home, target=target, route=links, cwd=tmp_path,
                                  extra_env={"TMPDIR": str(tmp)})
        assert (proc.returncode == 0) is ok, proc.stderr[-3000:]
        assert len(report["phases"]) >= 2, report["phases"]  # sandboxed calls ran and made their dirs
        assert [p.name for p in tmp.iterdir() if p.name.startswith("pipguard-")] == [], list(tmp.iterdir())
        tmp.rename(tmp_path / f"tmpdir-{project.name}")


def test_editable_imports_from_the_source_tree(tmp_path, fake_home, route, any_pip_target):
    target = any_pip_target
    proj = write_project(tmp_path, "editproj")
    proc, report = pg_install(["-e", "."], home=fake_home, target=target, route=route, cwd=proj)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where = subprocess.run([str(target / "bin" / "python"), "-c",
                            "import editproj; print(editproj.__file__)"], capture_output=True, text=True,
                           cwd="/")
    assert where.stdout.strip() == str(proj / "editproj" / "__init__.py"), where.stderr
    assert "build_editable" in [p["name"] for p in report["phases"]]
    (pkg,) = report["packages"]
    assert pkg["verdict"] == "clean"
    assert all(f["severity"] == "info" for f in pkg["findings"])  # the editable finder, recognised


def test_requirements_file_with_relative_paths_and_editable_lines(tmp_path, fake_home, route, any_pip_target):
    target = any_pip_target
    work = tmp_path / "work"
    write_flit_project(work / "libs", "reqlib")
    write_flit_project(work / "libs", "reqedit")
    (work / "requirements.txt").write_text("./libs/reqlib\n-e ./libs/reqedit\nlight_pure\n")
    proc, _ = pg_install(["-r", "requirements.txt"], home=fake_home, target=target, route=route,
                         cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = pip_list(target)
    assert {"reqlib", "reqedit", "light-pure"} <= set(installed), installed


# --------------------------------------------------------------------------- the target's state
def test_installed_versions_kept_without_upgrade(tmp_path, fake_home, route, target):
    extra = route.add(tmp_path / "extra")
    for version in ("1.0", "2.0"):
        build_sdist(write_flit_project(tmp_path / version, "keepme", version), extra)
    first, _ = pg_install(["keepme==1.0"], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    again, report = pg_install(["keepme"], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert pip_list(target)["keepme"] == "1.0"
    assert "already satisfied" in again.stdout.lower()
    assert report["phases"] == []  # nothing was built: pip had nothing to do
    upgraded, _ = pg_install(["-U", "keepme"], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr[-2000:]
    assert pip_list(target)["keepme"] == "2.0"


@pytest.mark.parametrize("where", ["--target", "--prefix"])
def test_target_and_prefix(tmp_path, fake_home, route, any_pip_target, where):
    target = any_pip_target
    dest = tmp_path / "dest"
    proc, _ = pg_install([where, str(dest), "light_pure"], home=fake_home, target=target,
                         route=route, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = list(dest.rglob("light_pure/__init__.py"))
    assert found, sorted(str(p) for p in dest.rglob("*"))[:20]
    assert "light-pure" not in pip_list(target)  # not in the venv itself


def test_an_in_tree_backend_builds_with_every_pip(tmp_path, fake_home, links, any_pip_target):
    """A project whose backend lives in its own tree (``backend-path``, as setuptools', flit's
    and pdm's own sdists have): each pip's pyproject-hooks names that path in a variable of its
    own (pip 26.3's as JSON), which the hook call's scrubbed environment must keep, or the
    backend cannot be imported and a valid project is refused (it was, on pip 26.3)."""
    from support.handbackend import write_hand_project

    extra = links.add(tmp_path / "extra")
    build_sdist(write_hand_project(tmp_path / "src", "intree", members={"intree/__init__.py": "OK = 1\n"}), extra)
    proc, report = pg_install(["intree"], home=fake_home, target=any_pip_target, route=links, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "clean" and pip_list(any_pip_target).get("intree") == "1.0", report["packages"]
    assert "build_wheel" in [p["name"] for p in report["phases"]]


# --------------------------------------------------------------------------- build requirements
def test_dynamic_build_requirements(tmp_path, fake_home, route, any_pip_target):
    """setup_requires is asked for through get_requires_for_build_wheel; pip installs it into
    the build environment (a pip subprocess: its own builds are sandboxed too)."""
    target = any_pip_target
    extra = route.add(tmp_path / "extra")
    build_sdist(write_flit_project(tmp_path / "h", "dynhelper"), extra)
    build_sdist(write_project(tmp_path / "d", "dynreq", setup_extra=", setup_requires=['dynhelper']"),
                extra)
    proc, report = pg_install(["dynreq"], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pip_list(target).get("dynreq") == "1.0"
    assert "dynhelper" not in pip_list(target)  # a build requirement, not installed
    built = {(p["package"], p["name"]) for p in report["phases"]}
    assert ("dynhelper", "build_wheel") in built, built  # built in a sandbox for the build env


def test_quoted_marker_in_build_requires(tmp_path, fake_home, route, any_pip_target):
    target = any_pip_target
    extra = route.add(tmp_path / "extra")
    pyproject = ('[build-system]\nrequires = ["setuptools", "Cython; python_version < \'3.99\'", '
                 '"wheel; python_version >= \'3\'"]\nbuild-backend = "setuptools.build_meta"\n')
    build_sdist(write_project(tmp_path / "q", "quotedmarker", pyproject=pyproject), extra)
    proc, _ = pg_install(["quotedmarker"], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pip_list(target).get("quotedmarker") == "1.0"


# --------------------------------------------------------------------------- attacks at the seam
SIBLING_ATTACK = """
import os
# pip unpacks every sdist of the install next to this one: <pip-install-*>/<name>_<hash>
parent = os.path.dirname(os.getcwd())
try:
    names = os.listdir(parent)
except OSError:
    names = []
for name in names:
    if name.startswith('victim'):
        try:
            with open(os.path.join(parent, name, 'victim', '__init__.py'), 'w') as handle:
                handle.write('POISONED = True\\n')
        except OSError:
            pass
"""


def test_build_cannot_rewrite_a_sibling_tree(tmp_path, fake_home, route, any_pip_target):
    """The attacker lists pip's temp area (the parent of its own tree) to find the victim's
    unpacked sdist, and rewrites it before the victim's build_wheel runs. Listing the parent is
    what setuptools-scm's honest walk up does (issue 29: not a finding); what matters is that it
    finds nothing to write: under ns the parent shows only this call's grants, under the plain
    backend the listing fails. Either the install is refused, or what is installed is the
    victim as published (a listed and written sibling put POISONED into its wheel)."""
    target = any_pip_target
    extra = route.add(tmp_path / "extra")
    build_sdist(write_flit_project(tmp_path / "v", "victim"), extra)
    # sorts after victim: pip unpacks victim first, then runs the attacker's hooks
    attacker = write_project(tmp_path / "a", "zattacker", setup_extra="")
    (attacker / "setup.py").write_text(SIBLING_ATTACK + (attacker / "setup.py").read_text())
    build_sdist(attacker, extra)
    before = listing(target)
    proc, report = pg_install(["victim", "zattacker"], home=fake_home, target=target, route=route,
                              cwd=tmp_path)
    assert not any(e["kind"] == "file-write" and e["action"] == "allowed" and "victim" in e["target"]
                   for e in report["events"])
    if proc.returncode != 0:
        assert listing(target) == before
        return
    poisoned = subprocess.run([str(target / "bin" / "python"), "-c",
                               "import victim; print(getattr(victim, 'POISONED', False))"],
                              capture_output=True, text=True)
    assert poisoned.stdout.strip() == "False", (poisoned.stdout, poisoned.stderr, proc.stderr[-2000:])


KNOWN_SIBLING_ATTACK = """
import subprocess
# the victim's tree is the user's project directory: its path is no secret to guess
victim = {victim!r}
try:  # the loud form: a Python write, seen by the audit hook
    with open(victim + '/victim/__init__.py', 'a') as handle:
        handle.write('POISONED = True\\n')
except OSError:
    pass
# the quiet form: a native write (a shell's redirection), seen only by the OS layer
subprocess.call(['sh', '-c', 'echo POISONED = True >> "$0" 2>/dev/null', victim + '/victim/native.py'])
"""


def test_build_cannot_write_a_sibling_tree_it_knows(tmp_path, fake_home, route, any_pip_target):
    """The listing test above shows a build cannot find pip's other trees; here it needs no
    listing: the sibling is a local project (pip builds it in place, at a path anyone can know)
    and the attacker writes into it by name, from Python and natively. Both writes fail, both
    are reported, the user's tree is unchanged and nothing is installed."""
    victim = write_flit_project(tmp_path / "v", "victim")
    pristine = (victim / "victim" / "__init__.py").read_text()
    extra = route.add(tmp_path / "extra")
    attacker = write_project(tmp_path / "a", "zknower", setup_extra="")
    (attacker / "setup.py").write_text(KNOWN_SIBLING_ATTACK.format(victim=str(victim))
                                       + (attacker / "setup.py").read_text())
    build_sdist(attacker, extra)
    before = listing(any_pip_target)
    proc, report = pg_install([str(victim), "zknower"], home=fake_home, target=any_pip_target,
                              route=route, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(any_pip_target) == before
    assert (victim / "victim" / "__init__.py").read_text() == pristine
    assert not (victim / "victim" / "native.py").exists()
    blocked = {e["target"] for e in report["events"] if e["kind"] == "file-write" and e["action"] == "blocked"}
    assert str(victim / "victim" / "__init__.py") in blocked, report["events"]
    assert str(victim / "victim" / "native.py") in blocked, report["events"]
    (pkg,) = [p for p in report["packages"] if p["name"] == "zknower"]
    assert pkg["verdict"] == "blocked", pkg


def test_wheel_dropped_next_to_its_own_is_refused(tmp_path, fake_home, route, any_pip_target):
    """A build that adds a second wheel to the directory pip gave it (a tampered wheel of an
    installed package, say) fails and is reported; nothing is installed."""
    target = any_pip_target
    extra = route.add(tmp_path / "extra")
    proj = write_project(tmp_path / "d", "dropper")
    (proj / "setup.py").write_text(textwrap.dedent("""\
        import os, sys
        from setuptools import setup
        from setuptools.command.bdist_wheel import bdist_wheel

        class dropping(bdist_wheel):
            def run(self):
                super().run()
                # setuptools builds in WHEEL_DIRECTORY/.tmp-*: the parent is the directory pip gave
                out = os.path.dirname(os.path.abspath(self.dist_dir))
                with open(os.path.join(out, 'pip-99-py3-none-any.whl'), 'wb') as handle:
                    handle.write(b'PK\\x05\\x06' + b'\\0' * 18)

        setup(name='dropper', version='1.0', packages=['dropper'], cmdclass={'bdist_wheel': dropping})
        """))
    build_sdist(proj, extra)
    before = listing(target)
    proc, report = pg_install(["dropper"], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    (pkg,) = [p for p in report["packages"] if p["name"] == "dropper"]
    assert pkg["verdict"] == "blocked"
    assert any(f["rule"] == "unexpected-output" and f["member"].endswith("pip-99-py3-none-any.whl")
               for f in pkg["findings"]), pkg


CREDENTIAL_HUNT = """
import glob, os, sys
found = [repr(dict(os.environ)), repr(sys.argv)]
for pattern in ('/proc/*/cmdline', '/proc/*/environ', '/proc/*/task/*/cmdline', '/etc/pip.conf',
                '/etc/xdg/pip/pip.conf', os.path.expanduser('~/.config/pip/pip.conf'),
                os.path.expanduser('~/.netrc')):
    for path in glob.glob(pattern):
        try:
            with open(path, 'rb') as handle:
                found.append(handle.read().decode('latin-1'))
        except OSError:
            pass
os.makedirs('hunter', exist_ok=True)
with open(os.path.join('hunter', 'loot.py'), 'w') as handle:
    handle.write('LOOT = ' + repr('\\n'.join(found)) + '\\n')
"""

QUIET_HUNT = """
import os, sys
os.makedirs('hunter', exist_ok=True)
with open(os.path.join('hunter', 'loot.py'), 'w') as handle:
    handle.write('LOOT = ' + repr(repr(dict(os.environ)) + repr(sys.argv)) + '\\n')
"""


NATIVE_HUNT = """
import os, subprocess
# native reads of every command line (unobserved with --no-observe-reads): pip's own
# subprocesses get the index URL, but never on their command line
loot = subprocess.run(['sh', '-c', 'cat /proc/[0-9]*/cmdline /proc/[0-9]*/task/*/cmdline 2>/dev/null'],
                      stdout=subprocess.PIPE).stdout.decode('latin-1')
os.makedirs('hunter', exist_ok=True)
with open(os.path.join('hunter', 'loot.py'), 'w') as handle:
    handle.write('LOOT = ' + repr(loot) + '\\n')
"""


@pytest.mark.parametrize("style", ["quiet", "loud", "native-unobserved"])
def test_index_credentials_never_reach_a_sandbox(tmp_path, fake_home, wheelhouse, sdists, any_pip_target, style):
    """The token in PIP_INDEX_URL: not in any hook call's environ or argv, not in another
    process's /proc it could read, not in what gets installed."""
    target = any_pip_target
    route = Route("index", [wheelhouse, sdists])
    try:
        extra = route.add(tmp_path / "extra")
        proj = write_project(tmp_path / "h", "hunter")
        hunt = {"loud": CREDENTIAL_HUNT, "quiet": QUIET_HUNT, "native-unobserved": NATIVE_HUNT}[style]
        (proj / "setup.py").write_text(hunt + (proj / "setup.py").read_text())
        if style == "native-unobserved":
            # the hunt runs in a build requirement's build, inside the pip subprocess pip starts
            # with the index URL (on its command line, had pipguard left it there); its loot
            # rides into the build environment and from there into the installed package
            dep = write_project(tmp_path / "d", "hunterdep")
            (dep / "setup.py").write_text(hunt.replace("'hunter'", "'hunterdep'")
                                          + (dep / "setup.py").read_text())
            build_sdist(dep, extra)
            (proj / "pyproject.toml").write_text(BACKEND.replace('"setuptools"', '"setuptools", "hunterdep"'))
            (proj / "setup.py").write_text(
                "import os\nimport hunterdep.loot\nos.makedirs('hunter', exist_ok=True)\n"
                "open('hunter/loot.py', 'w').write('LOOT = ' + repr(hunterdep.loot.LOOT))\n"
                + (proj / "setup.py").read_text().split("\n", 0)[0].split(hunt, 1)[-1])
        build_sdist(proj, extra)
        token = route.index.token
        flags = ["--no-observe-reads"] if style == "native-unobserved" else []
        proc, report = pg_install([*flags, "hunter"], home=fake_home, target=target, route=route,
                                  cwd=tmp_path)
        assert any(authorized for _m, _p, authorized in route.index.requests)  # the index was used
    finally:
        route.stop()
    for path in target.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
    assert token not in (tmp_path / "install-report.json").read_text()
    if style != "loud":
        assert proc.returncode == 0, proc.stderr[-3000:]  # nothing reported: installed, token absent
        assert site_import(target, "hunter").returncode == 0
    else:
        assert proc.returncode == 1, proc.stderr[-3000:]  # it tried other processes' /proc
        assert [e for e in report["events"] if e["action"] == "blocked" and e["kind"] == "file-read"]


FETCHER = """
import os, urllib.request
url = os.environ.get('PIPGUARD_TEST_FETCH')
if url:
    os.makedirs('fetcher', exist_ok=True)
    data = urllib.request.urlopen(url, timeout=20).read()
    with open(os.path.join('fetcher', 'fetched.txt'), 'wb') as handle:
        handle.write(data)
"""


@pytest.mark.parametrize("allowed", [True, False])
def test_build_host_allow_list(tmp_path, fake_home, route, target, loopback_tcp, allowed, build_host):
    """A build that downloads (as a Rust/Go sdist fetches crates): denied by default, allowed
    with --allow-build-host through the filtering proxy, the destination recorded either way."""
    port = build_host.port
    extra = route.add(tmp_path / "extra")
    proj = write_project(tmp_path / "f", "fetcher")
    (proj / "setup.py").write_text(FETCHER + (proj / "setup.py").read_text())
    build_sdist(proj, extra)
    args = ["--keep-env", "PIPGUARD_TEST_FETCH", "fetcher"]
    if allowed:
        args = ["--allow-build-host", f"127.0.0.1:{port}", *args]
    proc, report = pg_install(args, home=fake_home, target=target, route=route, cwd=tmp_path,
                              extra_env={"PIPGUARD_TEST_FETCH": f"http://127.0.0.1:{port}/crate.txt"})
    network = report["network"]
    if allowed:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert any(n["port"] == port and n["action"] == "allowed" for n in network), network
    else:
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "fetcher" not in pip_list(target)
        assert any(e["kind"] == "network" and e["action"] == "blocked" for e in report["events"])


@pytest.mark.parametrize("version", ["3.9", "3.13"])
def test_target_interpreter_of_another_version(tmp_path, fake_home, route, version):
    """--python of another CPython: its own pip (3.9's bundled pip is 23.0) runs the seam, which
    is stdlib-only; the hook calls run that interpreter in the sandbox."""
    from support import python_versions

    python = python_versions().get(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    from support.pipinstall import other_python_venv

    venv = other_python_venv(python, tmp_path / f"target{version}")
    proc, report = pg_install(["light_pure"], home=fake_home, target=venv, route=route, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert site_import(venv, "light_pure").returncode == 0
    assert any(p["name"] == "build_wheel" for p in report["phases"])


def test_credentials_leave_pip_command_lines():
    """Index URLs with a user part move from a pip command line (world-readable in
    /proc/PID/cmdline) into pip's environment variables, with pip's precedence kept."""
    from pipguard.install._seam.credentials import move_credentials

    args, env = move_credentials(
        ["install", "-i", "https://u:t@h/simple", "--extra-index-url=https://a:b@x/s", "-f", "/local",
         "--find-links", "http://plain/x", "--", "-i", "kept"], {"PIP_EXTRA_INDEX_URL": "https://e/s"})
    assert args == ["install", "-f", "/local", "--find-links", "http://plain/x", "--", "-i", "kept"]
    assert env == {"PIP_INDEX_URL": "https://u:t@h/simple",
                   "PIP_EXTRA_INDEX_URL": "https://e/s https://a:b@x/s"}
    # a store option's last value wins in pip, a credentialed one or not: leaving a plain
    # `-i` on the command line (which beats the variable) made the other index win
    for given, wins in ((["-i", "https://plain/s", "-i", "https://u:t@h/s"], "https://u:t@h/s"),
                        (["-i", "https://u:t@h/s", "--index-url=https://plain/s"], "https://plain/s")):
        args, env = move_credentials(["install", *given, "pkg"], {})
        assert (args, env) == (["install", "pkg"], {"PIP_INDEX_URL": wins}), given


def test_no_use_pep517_is_overridden_with_a_note(tmp_path, fake_home, links, target, wheelhouse):
    """pip 23.2 with --no-use-pep517 would run `setup.py install` outside any hook: pipguard's
    --use-pep517 (added last, so it wins) routes the project through the sandboxed hooks,
    and says so instead of silently changing what was asked."""
    proj = write_project(tmp_path, "legacyproj", pyproject="")
    (proj / "pyproject.toml").unlink()  # a setup.py-only project: pip's legacy candidate
    # pip itself refuses --no-use-pep517 unless setuptools and wheel are in the target
    subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "-f",
                    str(wheelhouse), "wheel", "setuptools"], check=True,
                   env={"PATH": os.environ["PATH"], "PIP_CONFIG_FILE": os.devnull})
    proc, report = pg_install(["--no-use-pep517", str(proj)], home=fake_home, target=target, route=links,
                              cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--no-use-pep517 is overridden" in proc.stderr
    assert pip_list(target).get("legacyproj") == "1.0"
    assert "build_wheel" in [p["name"] for p in report["phases"]]


def test_dry_run_runs_metadata_hooks_sandboxed_and_installs_nothing(tmp_path, fake_home, links, target):
    """pip --dry-run resolves, which prepares sdists' metadata: package code, sandboxed."""
    before = listing(target)
    proc, report = pg_install(["--dry-run", "light_pure"], home=fake_home, target=target, route=links,
                              cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Would install" in proc.stdout
    assert listing(target) == before
    assert "prepare_metadata_for_build_wheel" in [p["name"] for p in report["phases"]]


@pytest.mark.parametrize("style", ["module", "console-script"])
def test_wheel_overwriting_another_distribution_is_refused(tmp_path, fake_home, route, target, style):
    """A quiet attacker's build needs no blocked attempt: its wheel simply carries a file of
    another installed distribution (``light_pure/__init__.py``) or a console script named
    ``pip``. pip would overwrite them; the gate refuses, naming both owners."""
    first, _ = pg_install(["light_pure"], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    extra = route.add(tmp_path / "extra")
    if style == "module":
        proj = write_project(tmp_path / "o", "overwriter")
        (proj / "light_pure").mkdir()
        (proj / "light_pure" / "__init__.py").write_text("POISONED = True\n")
        (proj / "setup.py").write_text(
            "from setuptools import setup\n"
            "setup(name='overwriter', version='1.0', packages=['overwriter', 'light_pure'])\n")
    else:
        proj = write_project(tmp_path / "o", "overwriter", setup_extra=(
            ", entry_points={'console_scripts': ['pip = overwriter:main']}"),
            module_code="def main():\n    print('not pip')\n")
    build_sdist(proj, extra)
    before = listing(target)
    proc, report = pg_install(["overwriter"], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    (pkg,) = [p for p in report["packages"] if p["name"] == "overwriter"]
    owned = [f for f in pkg["findings"] if f["rule"] == "overwrites-other"]
    assert owned and owned[0]["severity"] == "critical", pkg["findings"]
    assert ("light" in owned[0]["message"]) if style == "module" else ("pip" in owned[0]["member"])


def _tree(venv: Path) -> set:
    site = next(venv.glob("lib/python*/site-packages"))
    return {str(p.relative_to(venv)) for p in site.rglob("*")
            if "__pycache__" not in p.parts and not p.name.endswith(".pyc")} | {
        str(p.relative_to(venv)) for p in (venv / "bin").iterdir()}


def test_same_result_as_plain_pip(tmp_path, fake_home, route, wheelhouse):
    """The same arguments through plain pip and through pipguard leave the same distributions
    and the same files (pip is doing the packaging either way)."""
    from support.pipinstall import make_venv

    proj = write_project(tmp_path / "p", "sameproj", setup_extra=", extras_require={'x': ['legit_pure']}",
                         )
    (proj / "setup.py").write_text((proj / "setup.py").read_text().replace(
        "packages=['sameproj']", "packages=['sameproj'], entry_points={'console_scripts': "
        "['sameproj-cli = sameproj:VALUE']}"))
    plain = make_venv(tmp_path / "plain", "bundled", wheelhouse)
    guarded = make_venv(tmp_path / "guarded", "bundled", wheelhouse)
    args = [f"{proj}[x]", "six" if any(wheelhouse.glob("six-*")) else "wheel"]
    env = fake_home.env(route.env())
    subprocess.run([str(plain / "bin" / "python"), "-m", "pip", "install", "-q", *route.args(), *args],
                   check=True, env=env, cwd=tmp_path)
    proc, _ = pg_install(args, home=fake_home, target=guarded, route=route, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pip_list(guarded) == pip_list(plain)
    assert _tree(guarded) ^ _tree(plain) == set()


# --------------------------------------------------------------------------- start-up order
_AT_PIP_START = r"""
import json, os, sys
def hook(event, args):
    if event == "subprocess.Popen":  # the CLI starts pip: what has it imported by then?
        os.write(1, json.dumps(sorted(m for m in sys.modules if m.startswith(("pipguard", "packaging", "click")))).encode())
        os._exit(0)
sys.addaudithook(hook)
from pipguard.cli.app import main
sys.argv = ["pipguard", "install", "--sandbox", "--python", sys.executable, "--no-index", "nothing-here"]
main()
"""


def test_pip_starts_before_the_models_and_the_sandbox_are_imported(tmp_path):
    """pip is started as soon as its command line is known: the installer, pipguard's own
    option checks (limits, the policy file), the report, the result models, the planner and the
    sandbox are imported while pip starts (or where they are used), not before; a plain install
    command line is parsed without click (~25 ms of imports). The result models are still
    reachable from pipguard.install.installer, as before."""
    proc = subprocess.run([sys.executable, "-c", _AT_PIP_START], cwd=tmp_path, capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if not k.startswith("PIP_")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = set(json.loads(proc.stdout))
    assert {"pipguard.cli.app", "pipguard.cli.install", "pipguard.install.seam"} <= imported, imported
    later = {"pipguard.cli.run", "pipguard.cli.approve", "pipguard.cli.pkgbuild", "pipguard.cli.doctor",
             "pipguard.cli.doctor_checks",
             "pipguard.install.installer", "pipguard.install.session", "pipguard.install.hooks",
             "pipguard.install.gating", "pipguard.install.importprobe", "pipguard.sandbox.limits", "pipguard.install.policyfile", "pipguard.install.approvals",
             "pipguard.sandbox.policy", "pipguard.report.model", "pipguard.install.result", "pipguard.sandbox.files", "pipguard.gate.scan",
             "pipguard.install.hookcall", "pipguard.sandbox.plan", "pipguard.sandbox.api", "pipguard.sandbox.launcher", "packaging",
             "click"}
    assert not imported & later, imported & later
    from pipguard.install import installer as install, result as install_result

    assert install.InstallResult is install_result.InstallResult and install.Phase is install_result.Phase
    with pytest.raises(AttributeError):
        install.NoSuchName  # noqa: B018

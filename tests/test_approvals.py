"""Approvals pinned to artifacts (``pipguard.toml`` / ``[tool.pipguard]``) and the messages of a
refusal: a refused install, ``pipguard approve --from-report`` writing the entries, the same
artifact then installing, a changed artifact refusing again; malformed policies exit 2 with one
line. Real pip, real sdists built in the test, both routes where the route matters (the artifact's
hash comes from pip: the index's hash or pip's own hashing of a --find-links file)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import build_sdist
from support.pipinstall import PY, listing, make_venv, pg_install, site_import

BACKEND = '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

# A build that creates a POSIX semaphore (multiprocessing.Lock; joblib does the same at import):
# on the plain backend /dev/shm is not writable, the build copes as joblib does (serial mode),
# and the refused create is reported as write-outside-roots /dev/shm/sem.<random>. Under the
# namespace backend (auto's choice where it works) /dev/shm is the run's own tmpfs and nothing
# is refused, so these tests name the plain backend (PLAIN_BACKEND); approvals do not depend on it.
PLAIN_BACKEND = ("--isolation", "os")
SEMAPHORE_SETUP = """\
import multiprocessing
try:
    multiprocessing.Lock()
except OSError:
    pass  # joblib: "will operate in serial mode"
from setuptools import setup
setup(name={name!r}, version="1.0", packages=[{pkg!r}])
"""


def write_sdist(tmp_path: Path, out: Path, name: str, setup_py: str, *, files=None, salt: str = "") -> Path:
    """An sdist of a setuptools project ``name`` (package ``name``), into ``out``; ``salt``
    changes the artifact without changing what it does."""
    src = tmp_path / "src" / (name + salt)
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f"# {salt}\n")
    (src / "pyproject.toml").write_text(BACKEND)
    (src / "setup.py").write_text(setup_py)
    for rel, text in (files or {}).items():
        (src / rel).write_text(text)
    return build_sdist(src, out, name=name, version="1.0")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def approve(cwd: Path, report: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "pipguard", "approve", "--from-report", str(report), *extra],
                          cwd=cwd, capture_output=True, text=True, env=env)


# ------------------------------------------------------------------ runtime attempt approvals
def test_approved_attempt_passes_changed_artifact_refuses(tmp_path, fake_home, route, target, wheelhouse):
    """Issue 13 items 4 and 5: a build's refused semaphore in /dev/shm refuses the install (a
    finding on the plain backend); approved for that sdist's sha256 it installs, and nothing was
    written to /dev/shm; the same package with other bytes refuses again."""
    extra = route.add(tmp_path / "extra")
    sdist = write_sdist(tmp_path, extra, "semabuild", SEMAPHORE_SETUP.format(name="semabuild", pkg="semabuild"))
    work = tmp_path / "work"
    work.mkdir()
    before = listing(target)
    shm_before = set(os.listdir("/dev/shm"))

    proc, report = pg_install([*PLAIN_BACKEND, "semabuild"], home=fake_home, target=target, route=route, cwd=work)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    (pkg,) = [p for p in report["packages"] if p["name"] == "semabuild"]
    assert pkg["origin"] == {"filename": sdist.name, "sha256": sha256_of(sdist)}, pkg
    blocked = [e for e in pkg["events"] if e["rule"] == "write-outside-roots"]
    assert blocked and blocked[0]["target"].startswith("/dev/shm/sem."), pkg["events"]
    # the refusal says what was seen and what to do next, in runtime-attempt words
    assert "attempted what a build may not" in proc.stderr and "/dev/shm/sem." in proc.stderr
    assert "pipguard approve --from-report" in proc.stderr and sha256_of(sdist) in proc.stderr
    assert "or drop semabuild" in proc.stderr
    (refusal,) = report["refusals"]
    assert refusal["kind"] == "attempt" and refusal["origin"]["sha256"] == sha256_of(sdist)

    # learn: the entries, written for a human to review
    done = approve(work, work / "install-report.json", "--write")
    assert done.returncode == 0, done.stderr
    policy_text = (work / "pipguard.toml").read_text()
    policy = tomllib.loads(policy_text)
    (entry,) = policy["approve"]
    assert entry == {"package": "semabuild==1.0", "sha256": sha256_of(sdist),
                     "attempt": "write-outside-roots", "target": "/dev/shm/sem.*", "reason": ""}
    assert "# seen:" in policy_text
    again = approve(work, work / "install-report.json")  # already approved: nothing new
    assert again.returncode == 0 and "nothing to approve" in again.stderr, again.stdout + again.stderr

    proc, report = pg_install([*PLAIN_BACKEND, "semabuild"], home=fake_home, target=target, route=route, cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert site_import(target, "semabuild").returncode == 0
    (pkg,) = [p for p in report["packages"] if p["name"] == "semabuild"]
    assert pkg["verdict"] == "approved" and pkg["events"], pkg
    # every accepted attempt is still listed, says it does not count, and names its approval
    for event in pkg["events"]:
        assert event["severity"] == "info" and event["detail"]["approved"]["sha256"] == sha256_of(sdist)
    top = [e for e in report["events"] if e["rule"] == "write-outside-roots"]
    assert top and all(e["severity"] == "info" and e["detail"]["approved"] for e in top)
    assert report["policy_file"] == str(work / "pipguard.toml")
    assert "Accepted by approvals" in proc.stderr
    # accepted is not granted: the semaphore was refused, /dev/shm is as it was
    assert not {n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith("sem.")}

    # a changed artifact (same name and version, other bytes) needs a new approval
    target2 = make_venv(tmp_path / "target2", "bundled", wheelhouse)
    sdist.unlink()
    changed = write_sdist(tmp_path, extra, "semabuild", SEMAPHORE_SETUP.format(name="semabuild", pkg="semabuild"),
                          salt="changed")
    assert sha256_of(changed) != entry["sha256"]
    before = listing(target2)
    proc, report = pg_install([*PLAIN_BACKEND, "--no-cache-dir", "semabuild"], home=fake_home, target=target2, route=route,
                              cwd=work)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target2) == before
    (pkg,) = [p for p in report["packages"] if p["name"] == "semabuild"]
    assert pkg["origin"]["sha256"] == sha256_of(changed) and pkg["verdict"] == "blocked"


def test_approval_of_another_rule_does_not_cover(tmp_path, fake_home, links, target):
    """An approval names one rule and target: a credential read by the same artifact still refuses."""
    extra = links.add(tmp_path / "extra")
    setup_py = SEMAPHORE_SETUP.replace(
        "from setuptools import setup",
        "import os\ntry:\n    open(os.path.expanduser('~/.ssh/id_rsa')).read()\nexcept OSError:\n    pass\n"
        "from setuptools import setup")
    sdist = write_sdist(tmp_path, extra, "semasteal", setup_py.format(name="semasteal", pkg="semasteal"))
    work = tmp_path / "work"
    work.mkdir()
    (work / "pipguard.toml").write_text(textwrap.dedent(f"""\
        [[approve]]
        package = "semasteal==1.0"
        sha256 = "{sha256_of(sdist)}"
        attempt = "write-outside-roots"
        target = "/dev/shm/sem.*"
        """))
    before = listing(target)
    proc, report = pg_install([*PLAIN_BACKEND, "semasteal"], home=fake_home, target=target, route=links, cwd=work)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    counting = [e for e in report["events"] if e["action"] == "blocked" and e.get("severity") != "info"
                and e["rule"] not in ("loopback-bind", "nscd-probe", "hook-bytecode", "config-lookup")]
    assert any(e["target"].endswith(".ssh/id_rsa") for e in counting), counting
    assert not any(e["target"].startswith("/dev/shm/") for e in counting), counting


# ------------------------------------------------------------------ gate finding approvals
PTH_SETUP = """\
import os
from setuptools import setup
from setuptools.command.build_py import build_py

class with_pth(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "hook.pth"),
                       os.path.join(self.build_lib, "{name}-hook.pth"))

setup(name={name!r}, version="1.0", packages=[{name!r}], cmdclass={{"build_py": with_pth}})
"""


def test_gate_approval_in_pyproject(tmp_path, fake_home, route, target):
    """A gate finding (an executable .pth) refuses in gate words; approved in [tool.pipguard] of the
    working directory's pyproject.toml for that sdist, the wheel built from it installs."""
    extra = route.add(tmp_path / "extra")
    sdist = write_sdist(tmp_path, extra, "pthhook", PTH_SETUP.format(name="pthhook"),
                        files={"hook.pth": "import os; os.environ.setdefault('PTHHOOK', '1')\n"})
    work = tmp_path / "work"
    work.mkdir()
    (work / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "0"\n\n[tool.pipguard]\n'
                                         'keep-env = []\n')
    before = listing(target)
    proc, report = pg_install(["pthhook"], home=fake_home, target=target, route=route, cwd=work)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    assert "the gate found in its wheel: pth-exec in pthhook-hook.pth" in proc.stderr
    assert "attempted what a build may not" not in proc.stderr
    (pkg,) = report["packages"]
    assert pkg["verdict"] == "gate" and pkg["origin"]["sha256"] == sha256_of(sdist)
    assert [f["counts"] for f in pkg["findings"] if f["rule"] == "pth-exec"] == [True]

    done = approve(work, work / "install-report.json", "--write")
    assert done.returncode == 0, done.stderr
    pyproject = tomllib.loads((work / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "mine"
    (entry,) = pyproject["tool"]["pipguard"]["approve"]
    assert entry["gate"] == "pth-exec" and entry["member"] == "pthhook-hook.pth"
    assert entry["sha256"] == sha256_of(sdist) and entry["package"] == "pthhook==1.0"

    proc, report = pg_install(["pthhook"], home=fake_home, target=target, route=route, cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (pkg,) = report["packages"]
    assert pkg["verdict"] == "approved"
    (finding,) = [f for f in pkg["findings"] if f["rule"] == "pth-exec"]
    assert finding["counts"] is False and finding["approved"]["sha256"] == sha256_of(sdist)
    assert list(target.glob("lib/python*/site-packages/pthhook-hook.pth"))


def test_policy_is_not_read_from_the_package(tmp_path, fake_home, links, target):
    """An sdist that ships its own pipguard.toml and [tool.pipguard] approving itself is refused:
    the policy comes from the working directory (or --policy), never from a package."""
    extra = links.add(tmp_path / "extra")
    placeholder = "0" * 64
    files = {"hook.pth": "import os\n",
             "pipguard.toml": f'[[approve]]\npackage = "selfok==1.0"\nsha256 = "{placeholder}"\n'
                              'gate = "pth-exec"\nmember = "*"\n'}
    write_sdist(tmp_path, extra, "selfok", PTH_SETUP.format(name="selfok"), files=files)
    work = tmp_path / "work"
    work.mkdir()
    proc, report = pg_install(["selfok"], home=fake_home, target=target, route=links, cwd=work)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert report["policy_file"] is None


# ------------------------------------------------------------------ malformed policies
SHA = "a" * 64


@pytest.mark.parametrize("name, text, words", [
    ("pipguard.toml", "approve = [\n", "not valid TOML"),
    ("pipguard.toml", "allow-reed = []\n", "unknown key(s) allow-reed"),
    ("pipguard.toml", '[[approve]]\npackage = "x==1"\nsha256 = "abc"\ngate = "pth-exec"\nmember = "*"\n',
     "sha256 must be 64"),
    ("pipguard.toml", f'[[approve]]\npackage = "x==1"\nsha256 = "{SHA}"\ngate = "r"\nattempt = "r"\n'
                      'member = "*"\n', "exactly one of gate"),
    ("pipguard.toml", f'[[approve]]\nsha256 = "{SHA}"\ngate = "r"\nmember = "*"\n', "NAME==VERSION"),
    ("pipguard.toml", f'[[approve]]\npackage = "x==1"\nsha256 = "{SHA}"\nattempt = "r"\n',
     "target is required"),
    ("pipguard.toml", 'allow-read = ["does/not/exist"]\n', "allow-read: does/not/exist: no such file"),
    ("pipguard.toml", 'keep-env = "HOME"\n', "keep-env must be a list of strings"),
    ("pipguard.toml", '[build-hosts]\nfoo = ["host:99999"]\n', "build-hosts.foo"),
    ("pyproject.toml", '[tool]\npipguard = 3\n', "[tool.pipguard] must be a table"),
])
def test_malformed_policy_is_one_line_exit_2(tmp_path, name, text, words):
    (tmp_path / name).write_text(text)
    for command in (["install", "--sandbox", "six"], ["sandbox", "six"],
                    ["approve", "--from-report", "r.json"]):
        if command[0] == "approve":
            (tmp_path / "r.json").write_text('{"schema": "pipguard.report/1", "packages": []}')
        proc = subprocess.run([PY, "-m", "pipguard", *command], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, (command, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and name in lines[0], (command, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_two_policies_in_one_directory_is_an_error(tmp_path):
    (tmp_path / "pipguard.toml").write_text("")
    (tmp_path / "pyproject.toml").write_text("[tool.pipguard]\n")
    proc = subprocess.run([PY, "-m", "pipguard", "sandbox", "six"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "two policies" in proc.stderr, proc.stderr


def test_policy_flag_names_a_file_or_directory(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "pipguard.toml").write_text("nonsense = 1\n")
    for given in (str(elsewhere), str(elsewhere / "pipguard.toml")):
        proc = subprocess.run([PY, "-m", "pipguard", "sandbox", "--policy", given, "six"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "unknown key(s) nonsense" in proc.stderr, proc.stderr
    proc = subprocess.run([PY, "-m", "pipguard", "sandbox", "--policy", str(tmp_path / "nope"), "six"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no such file" in proc.stderr


# ------------------------------------------------------------------ approve --from-report, offline
def _report(packages):
    return {"schema": "pipguard.report/1", "packages": packages}


def test_approve_round_trip_without_a_run(tmp_path):
    """The TOML approve writes parses back (tomllib) into exactly the approvals that cover what
    refused, with awkward characters escaped; local projects are comments, not entries."""
    import json

    from pipguard.install import approvals, policyfile

    odd = 'a "quoted"\\path\twith\x7fcontrol'
    digest = "b" * 64
    data = _report([
        {"name": "odd", "version": "2.0", "origin": {"filename": "odd-2.0.tar.gz", "sha256": digest},
         "findings": [{"rule": "pth-exec", "member": "x.pth", "severity": "critical", "counts": True,
                       "message": "runs code"},
                      {"rule": "pth-editable-path", "member": "y.pth", "severity": "info", "counts": False}],
         "events": [{"action": "blocked", "severity": "finding", "kind": "file-read", "rule": "home-read",
                     "target": odd, "detail": {"phase": "build_wheel"}},
                    {"action": "blocked", "severity": "finding", "kind": "file-write",
                     "rule": "write-outside-roots", "target": "/dev/shm/sem.Ab12Cd", "detail": {}},
                    {"action": "blocked", "severity": "info", "kind": "network", "rule": "loopback-bind",
                     "target": "[::1]:0", "detail": {}}]},
        {"name": "localproj", "version": "0.1", "origin": None,
         "events": [{"action": "blocked", "severity": "finding", "kind": "file-read", "rule": "secret-read",
                     "target": "/root/.ssh/id_rsa", "detail": {}}]},
        {"name": "fine", "version": "1", "origin": {"filename": "f.whl", "sha256": "c" * 64},
         "findings": [], "events": []},
    ])
    (tmp_path / "r.json").write_text(json.dumps(data))
    proc = approve(tmp_path, tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    parsed = tomllib.loads(proc.stdout)
    assert [(e["package"], e.get("gate") or e.get("attempt"), e.get("member") or e.get("target"))
            for e in parsed["approve"]] == [("odd==2.0", "pth-exec", "x.pth"),
                                            ("odd==2.0", "home-read", odd),
                                            ("odd==2.0", "write-outside-roots", "/dev/shm/sem.*")]
    assert "# not approvable: localproj==0.1" in proc.stdout
    assert not (tmp_path / "pipguard.toml").exists()  # printed only, without --write
    # written, loaded as a policy, and the loaded approvals cover exactly what refused
    assert approve(tmp_path, tmp_path / "r.json", "--write").returncode == 0
    loaded = policyfile.load(cwd=str(tmp_path)).approvals
    origin = approvals.Origin("odd-2.0.tar.gz", digest)
    assert loaded.finding(origin, "pth-exec", "x.pth")
    assert loaded.attempt(origin, "home-read", odd, "build_wheel")
    assert loaded.attempt(origin, "write-outside-roots", "/dev/shm/sem.Zz99Yy", "build_wheel")
    assert not loaded.attempt(origin, "write-outside-roots", "/dev/shm/psm_1", "build_wheel")
    assert not loaded.finding(approvals.Origin(None, "d" * 64), "pth-exec", "x.pth")
    # run again: everything is approved already, the file is unchanged
    text = (tmp_path / "pipguard.toml").read_text()
    again = approve(tmp_path, tmp_path / "r.json", "--write")
    assert again.returncode == 1 or "nothing to approve" in again.stderr
    assert (tmp_path / "pipguard.toml").read_text() == text


def test_approve_rejects_what_is_not_a_report(tmp_path):
    (tmp_path / "r.json").write_text("[1, 2]")
    proc = approve(tmp_path, tmp_path / "r.json")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    (tmp_path / "r.json").write_text("{nope")
    proc = approve(tmp_path, tmp_path / "r.json")
    assert proc.returncode == 2 and "not JSON" in proc.stderr, proc.stderr
    proc = approve(tmp_path, tmp_path / "missing.json")
    assert proc.returncode == 2 and "missing.json" in proc.stderr


def test_decoy_home_targets_are_named_with_a_tilde():
    import tempfile

    from pipguard.install.approvals import normalize_target

    tmp = tempfile.gettempdir()
    assert normalize_target(f"{tmp}/pipguard-ab12cd34/home/.ssh/id_rsa") == "~/.ssh/id_rsa"
    assert normalize_target(f"{tmp}/pipguard-ab12cd34/tmp/x") == "$TMPDIR/x"
    assert normalize_target("/root/.ssh/id_rsa") == "/root/.ssh/id_rsa"
    assert normalize_target(f"{tmp}/pipguard-ab12cd34/homework") == f"{tmp}/pipguard-ab12cd34/homework"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))

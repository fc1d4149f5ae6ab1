"""ACLs and special mode bits a build sets on the files of its write roots (issue 33):
whatever uid an entry names, they are put back as they were before the run and reported
(pipguard.sandbox.filemodes), under each backend, as root and as ``nobody``, from Python (the audit
hook sees ``os.setxattr``/``os.chmod``) and from native code (tests/helpers/try_one.c: only
the syscalls).

Which of the attempts the kernel lets through differs by backend (and each is asserted):
as root under ``--isolation os`` the sandbox runs as a leased uid and can change only what it
created; under ns it can change the user's files (idmapped) but name only the uids its
namespace maps; as ``nobody`` on the plain backend everything. setgid from ``chmod`` is
refused in the kernel (seccomp) everywhere. Whatever got through must be gone afterwards:
the ACLs the files had before the run are untouched, those of new files are only what they
inherited from their directory, and no special bit stays.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import support
from pg import Result, backend_param, pipguard
from support import requires
from support.pipinstall import pg_install
from support.projects import write_project

from pipguard.sandbox import acl

pytestmark = [requires("linux"), requires("seccomp_user_notif")]

ACCESS, DEFAULT = "system.posix_acl_access", "system.posix_acl_default"
OTHER_UID = 1234


def _acl_hex(mode: int, *named) -> str:
    entries = acl.from_mode(mode) + tuple(acl.Entry(acl.USER, perm, uid) for uid, perm in named)
    if named:  # the mask setfacl computes: the union of the group class
        entries += (acl.Entry(acl.MASK, mode >> 3 & 7 | max(perm for _uid, perm in named)),)
    return acl.encode(entries).hex()


def _attempts(nobody_uid: int = support.NOBODY):
    """(name, action, path, args): what the build tries, in order. ``src.py`` and ``pkg/`` are the
    user's (``pkg/`` with an ACL of the user's own), ``made`` and ``newdir/`` the build's."""
    return [
        ("named-user on the user's file", "setxattr", "src.py", [ACCESS, _acl_hex(0o644, (OTHER_UID, 7))]),
        ("named-user (mapped uid) on the user's file", "setxattr", "src.py",
         [ACCESS, _acl_hex(0o644, (nobody_uid, 7))]),
        ("named-user on a new file", "setxattr", "made", [ACCESS, _acl_hex(0o644, (OTHER_UID, 7))]),
        ("named-user (mapped uid) on a new file", "setxattr", "made2", [ACCESS, _acl_hex(0o644, (nobody_uid, 7))]),
        ("default ACL on the user's directory", "setxattr", "pkg", [DEFAULT, _acl_hex(0o777)]),
        ("default ACL on a new directory", "setxattr", "newdir", [DEFAULT, _acl_hex(0o777, (OTHER_UID, 7))]),
        ("default ACL (other rwx) on a new directory", "setxattr", "newdir2", [DEFAULT, _acl_hex(0o777)]),
        ("sticky on the user's directory", "chmod", "pkg", ["1755"]),
        ("sticky on a new directory", "chmod", "newdir", ["1777"]),
        ("setgid on a new directory", "chmod", "newdir2", ["2775"]),
        ("setgid+sticky on the user's directory", "chmod", "pkg", ["3755"]),
    ]


def _script(helper: list, attempts) -> str:
    """A shell script: make the build's own entries, then one helper call per attempt."""
    lines = ["set -u", "echo m > made; echo m > made2; mkdir newdir newdir2"]
    for _name, action, path, args in attempts:
        lines.append(" ".join(subprocess.list2cmdline([a]) for a in [*helper, action, path, *args]))
    # what the build makes after its default ACLs: inherits them (then put back with its directory)
    lines.append("echo later > newdir2/later")
    return "\n".join(lines)


def _state(root: Path) -> dict:
    """getfacl's view of every entry below ``root``: its special bits and both ACL xattrs."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [""] + dirnames + filenames:
            path = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            xattrs = {}
            for key in (ACCESS, DEFAULT):
                try:
                    xattrs[key] = os.getxattr(path, key, follow_symlinks=False).hex()
                except OSError:
                    pass
            out[os.path.relpath(path, root)] = (stat.S_IMODE(st.st_mode) & 0o7000, xattrs)
    return out


def _project(work: Path, owner=None) -> Path:
    """The user's tree: a file, and a directory with an ACL and a default ACL of the user's own
    (a colleague's read access), which must stay exactly as they are."""
    (work / "src.py").write_text("VALUE = 1\n")
    (work / "pkg").mkdir()
    (work / "pkg" / "mod.py").write_text("")
    os.setxattr(work / "pkg", ACCESS, bytes.fromhex(_acl_hex(0o755, (4321, 5))))
    os.setxattr(work / "pkg", DEFAULT, bytes.fromhex(_acl_hex(0o755, (4321, 5))))
    os.setxattr(work / "pkg" / "mod.py", ACCESS, bytes.fromhex(_acl_hex(0o644, (4321, 4))))
    if owner is not None:
        for path in (work, work / "src.py", work / "pkg", work / "pkg" / "mod.py"):
            os.chown(path, owner, owner)
    return work


def _check(r, work: Path, before: dict, attempts) -> None:
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(attempts), (r.stdout, r.stderr[-2000:])
    after = _state(work)
    report_file = ".pipguard-test-report.json"
    for path, was in before.items():
        assert after.get(path) == was, (path, was, after.get(path), results)
    for path, now in after.items():
        if path not in before and path != report_file:
            assert now == (0, {}), (path, now)  # a new entry: no ACL, no special bit
    findings = {(e["target"], s["rule"]) for e in r.blocked(kind="file-write")
                for s in e["detail"].get("stripped", [])}
    got_through = 0
    for (name, action, path, args), result in zip(attempts, results):
        if not result["ok"]:
            continue
        got_through += 1
        if action == "chmod":
            rules = {"sticky-mode"} if int(args[0], 8) & 0o1000 else set()
            rules |= {"privileged-mode"} if int(args[0], 8) & 0o6000 else set()
        else:
            rules = {"acl-added" if args[0] == ACCESS else "default-acl-added"}
        for rule in rules:
            assert (str(work / path), rule) in findings, (name, rule, findings)
    # the attempts that could not be made show the backend did its part, not nothing
    assert got_through >= 3, results
    setgid = [res for (_n, act, _p, args), res in zip(attempts, results) if act == "chmod" and args[0][0] in "23"]
    assert all(not res["ok"] and res["errname"] == "EPERM" for res in setgid), setgid


@pytest.mark.parametrize("helper, backend", [backend_param("plain", "native"), backend_param("plain", "python"),
                                             backend_param("ns", "native"), backend_param("ns", "python")],
                         indirect=["backend"])
def test_run_puts_back_acls_and_special_bits(work, fake_home, try_one_bin, try_one_py, helper, backend):
    """``pipguard run --allow-write DIR``: every ACL entry (access and default, for any uid) and
    sticky bit the build set in DIR is gone after the run, the user's own ACLs are as they were,
    and each one taken away is a finding."""
    (work / "tree").mkdir()
    tree = _project(work / "tree")
    attempts = _attempts()
    argv = [str(try_one_bin)] if helper == "native" else list(try_one_py)
    before = _state(tree)
    r = pipguard(["run", "--isolation", backend.isolation, "--allow-write", str(tree),
                  "--allow-read", os.path.dirname(argv[-1]), "--",
                  "/bin/sh", "-c", _script(argv, attempts)], cwd=tree, env=fake_home.env())
    assert r.report is not None, r.stderr[-3000:]
    _check(r, tree, before, attempts)
    assert r.report["verdict"] == "blocked"


@pytest.mark.parametrize("backend", [backend_param("plain"), backend_param("ns")], indirect=True)
def test_run_as_nobody_puts_back_acls(nobody_setup, try_one_bin, backend):
    """As an ordinary user the build runs as that user and may change the ACLs of every file
    of the user's in its write roots: the same is put back and reported."""
    home, work = nobody_setup
    tree = _project(work, owner=support.NOBODY)
    attempts = _attempts()
    before = _state(tree)
    proc = support.run_as_nobody(
        [sys.executable, "-m", "pipguard", "run", "--report", str(tree / ".pipguard-test-report.json"),
         "--isolation", backend.isolation, "--allow-write", str(tree),
         "--allow-read", str(try_one_bin.parent), "--",
         "/bin/sh", "-c", _script([str(try_one_bin)], attempts)],
        cwd=tree, env=home.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180)

    data = json.loads((tree / ".pipguard-test-report.json").read_text())
    _check(Result(proc.returncode, proc.stdout, proc.stderr, data), tree, before, attempts)


SETUP_ATTACK = """
import os
os.makedirs("gen", exist_ok=True)
with open("gen/data.txt", "w") as handle:
    handle.write("generated")
acl = {acl!r}
for path, name, value in acl:
    try:
        os.setxattr(path, name, bytes.fromhex(value))
    except OSError:
        pass
for path, mode in (("{pkg}", 0o1755), ("gen", 0o1777)):
    try:
        os.chmod(path, mode)
    except OSError:
        pass
"""


@pytest.mark.parametrize("backend", [backend_param("plain"), backend_param("ns")], indirect=True)
def test_install_of_a_local_project_puts_back_acls(tmp_path, fake_home, links, target, backend):
    """``pipguard install --sandbox`` of a local project builds in the user's checkout: a
    setup.py that puts a default ACL (other rwx) and an entry for another uid on the checkout's
    directories, and makes one sticky, leaves none of it there, and the install says so."""
    proj = write_project(tmp_path, "aclproj")
    pkg = proj / "aclproj"
    os.setxattr(pkg, ACCESS, bytes.fromhex(_acl_hex(0o755, (4321, 5))))
    attack = SETUP_ATTACK.format(pkg="aclproj", acl=[
        (".", DEFAULT, _acl_hex(0o777)),
        ("aclproj", DEFAULT, _acl_hex(0o777, (OTHER_UID, 7))),
        ("aclproj", ACCESS, _acl_hex(0o777, (OTHER_UID, 7), (4321, 7))),
        ("setup.py", ACCESS, _acl_hex(0o644, (support.NOBODY, 7))),
        # what the build made itself (all the leased uid of --isolation os may change)
        # (nobody: under ns the one uid besides the sandbox's its namespace maps)
        ("gen", DEFAULT, _acl_hex(0o777, (support.NOBODY, 7))),
        ("gen/data.txt", ACCESS, _acl_hex(0o644, (support.NOBODY, 7))),
    ])
    (proj / "setup.py").write_text(attack + (proj / "setup.py").read_text())
    before = _state(proj)
    proc, report = pg_install([*backend.install_args, "."], home=fake_home, target=target, route=links, cwd=proj)
    after = _state(proj)
    for path, was in before.items():
        assert after.get(path) == was, (path, was, after.get(path))
    for path, now in after.items():
        if path not in before:
            assert now == (0, {}), (path, now)
    assert report is not None, proc.stderr[-3000:]
    found = {(os.path.relpath(e["target"], proj), s["rule"]) for e in report["events"] if e["action"] == "blocked"
             for s in e["detail"].get("stripped", [])}
    assert {("gen", "default-acl-added"), ("gen", "sticky-mode"), ("gen/data.txt", "acl-added")} <= found, found
    if backend.ns:  # the user's own files too (idmapped: the sandbox is their owner)
        assert {(".", "default-acl-added"), ("aclproj", "sticky-mode")} <= found, found
    assert proc.returncode != 0, proc.stderr[-3000:]


HONEST_COPY = """
import os, shutil
if not os.path.exists("setup.py.orig"):  # once: each hook call runs setup.py
    shutil.copy2("setup.py", "setup.py.orig")  # copies the file's ACL (its xattrs) too
"""


@pytest.mark.parametrize("backend", [backend_param("plain"), backend_param("ns")], indirect=True)
def test_honest_build_in_a_checkout_with_acls_is_clean(tmp_path, fake_home, links, target, backend):
    """No false alarm: a checkout shared with a colleague (a default ACL and setgid on its
    directories, an ACL on a file) gets new files from an honest build, which inherit the default
    ACL and the setgid bit, and a copy that carries its source's ACL. All stay; nothing is
    reported; the install succeeds."""
    proj = write_project(tmp_path, "sharedproj")
    for directory in (proj, proj / "sharedproj"):
        # r-- for the colleague and the group: with r-x, a new 0644 file's mask (r--) narrows
        # an entry, which the sandbox user's grants refuse to widen (root, --isolation os: exit 2)
        os.setxattr(directory, DEFAULT, bytes.fromhex(_acl_hex(0o745, (4321, 4))))
        os.chmod(directory, 0o2755)
    os.setxattr(proj / "setup.py", ACCESS, bytes.fromhex(_acl_hex(0o644, (4321, 4))))
    (proj / "setup.py").write_text(HONEST_COPY + (proj / "setup.py").read_text())
    before = _state(proj)
    proc, report = pg_install([*backend.install_args, "."], home=fake_home, target=target, route=links, cwd=proj)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = _state(proj)
    for path, was in before.items():
        assert after.get(path) == was, (path, was, after.get(path))
    new_dirs = [p for p in after if p not in before and (proj / p).is_dir()]
    assert new_dirs and all(after[p][0] == 0o2000 and DEFAULT in after[p][1] for p in new_dirs), after
    if backend.ns:  # (as root under os the copy also carried the sandbox user's grant: the
        # release removes an ACL naming a sandbox uid whole)
        assert ACCESS in after["setup.py.orig"][1]
    assert not [e for e in report["events"] if e["action"] == "blocked"], report["events"]

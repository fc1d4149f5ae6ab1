"""As root, the sandbox runs as a leased unprivileged uid (issue 12, item 2).

Everything here runs real sandboxes as root (CI does) and checks the kernel's
answer: root-only canaries in system dirs stay unreadable and are reported,
grants made for the run (ACL entries on pip-style 0700 temp dirs) are gone
afterwards, what the sandbox created is given back and normalised, and the
sandbox user cannot reach pipguard's own state, run dir or event FIFO.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import support
from pg import pipguard
from support import requires

from pipguard.sandbox import acl, sandbox_user, uidlease
from pipguard.sandbox.policy import Policy
from pipguard.sandbox import run

PY = sys.executable
pytestmark = [requires("linux")]
ISOLATIONS = ["audit", pytest.param("os", marks=[requires("landlock", abi=6), requires("seccomp_user_notif")])]


@pytest.fixture
def work(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


def _tree_state(*roots):
    """(mode, uid, gid, access ACL) of every path under ``roots`` and of their ancestors."""
    state = {}
    paths = set()
    for root in roots:
        root = os.path.realpath(root)
        p = root
        while p != "/":
            p = os.path.dirname(p)
            paths.add(p)
        for dirpath, dirnames, filenames in os.walk(root):
            paths.add(dirpath)
            paths.update(os.path.join(dirpath, n) for n in dirnames + filenames)
    for p in paths:
        st = os.lstat(p)
        try:
            xattr = os.getxattr(p, acl.XATTR, follow_symlinks=False)
        except OSError:
            xattr = None
        state[p] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, xattr)
    return state


def _named_sandbox_uid(path) -> bool:
    return acl.names_user(str(path), sandbox_user.UIDS) or acl.names_user(str(path), sandbox_user.UIDS, default=True)


# --- canaries: root-only files in system dirs ----------------------------------------------------


@pytest.fixture
def canaries():
    """0600 root-owned files in dirs this test creates under /etc, /opt and /usr/local
    (all granted to the sandbox for reading), each with a unique marker."""
    need_root = support.gates.check("root")
    if need_root:
        support.gates.need("root")
    made, files = [], {}
    for parent in ("/etc", "/opt", "/usr/local"):
        if not os.path.isdir(parent):
            continue
        d = os.path.join(parent, f"pipguard-canary-{uuid.uuid4().hex[:8]}")
        os.mkdir(d, 0o755)
        made.append(d)
        marker = f"PIPGUARD-ROOT-ONLY-{uuid.uuid4().hex}"
        f = os.path.join(d, "secret.conf")
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, f"token = {marker}\n".encode())
        os.close(fd)
        files[f] = marker
    try:
        yield files
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


@requires("root")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_root_only_canaries_unreadable_and_reported_python(work, fake_home, canaries, isolation):
    """The loud and the quiet Python reader: open() each canary, and copy whatever it got
    into the build output (the wheel route). Nothing gets out; every attempt is reported."""
    script = work / "steal.py"
    script.write_text(textwrap.dedent(f"""
        import os
        got = []
        for path in {sorted(canaries)!r}:
            try:
                got.append(open(path).read())
            except PermissionError as exc:
                print("denied", path, exc.errno)
        open("build-output.txt", "w").write("".join(got))
    """))
    r = pipguard(["run", "--isolation", isolation, "--", PY, str(script)], cwd=work, env=fake_home.env())
    assert r.report is not None, r.stderr
    out = (work / "build-output.txt").read_text()
    for path, marker in canaries.items():
        assert marker not in r.stdout and marker not in out and marker not in json.dumps(r.report)
        assert f"denied {path} {errno.EACCES}" in r.stdout
    reported = r.targets(kind="file-read", rule="sandbox-user-denied")
    assert sorted(reported) == sorted(canaries), r.report["events"]
    assert r.report["host"]["sandbox_uid"] in sandbox_user.UIDS


@requires("root")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_root_only_canaries_unreadable_native(work, fake_home, canaries, isolation):
    """The quiet native reader (cat, no Python hook in the way): the kernel refuses
    it because the sandbox is not uid 0; capabilities alone did not."""
    cmd = "; ".join(f"cat {p} >> build-output.txt 2>/dev/null || echo refused {p}" for p in sorted(canaries))
    r = pipguard(["run", "--isolation", isolation, "--", "/bin/sh", "-c", cmd], cwd=work, env=fake_home.env())
    assert r.report is not None, r.stderr
    out = (work / "build-output.txt").read_text() if (work / "build-output.txt").exists() else ""
    for path, marker in canaries.items():
        assert marker not in out and f"refused {path}" in r.stdout, (r.stdout, r.stderr)


@requires("root")
def test_canaries_were_readable_to_root_without_the_switch(canaries):
    """What the test above guards against is real: the same canary *is* readable by a
    uid-0 process with every capability dropped (the old behaviour)."""
    path, marker = next(iter(canaries.items()))
    code = ("import ctypes, sys\n"
            "from pipguard.sandbox.oslayer import caps\n"
            "caps.set_no_new_privs(); caps.lock_securebits(); caps.drop_all()\n"
            f"print(open({path!r}).read())\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True)
    assert marker in r.stdout, r.stderr


# --- identity -----------------------------------------------------------------------------------


@requires("root")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_sandbox_runs_as_leased_uid_without_groups(work, fake_home, isolation):
    r = pipguard(["run", "--isolation", isolation, "--", PY, "-c",
                  "import os; print(os.getresuid(), os.getresgid(), os.getgroups())"],
                 cwd=work, env=fake_home.env())
    assert r.returncode == 0, r.stderr
    uid = r.report["host"]["sandbox_uid"]
    assert uid in sandbox_user.UIDS and r.report["host"]["sandbox_gid"] == uid
    assert r.stdout.strip() == f"({uid}, {uid}, {uid}) ({uid}, {uid}, {uid}) []"
    assert "user" in r.report["isolation"]["applied"]
    assert not [pid for pid in sandbox_user.processes_of(uid) if _cwd_under(pid, str(work))]


@requires("root")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_setuid_root_binary_does_not_make_the_sandbox_root(work, fake_home, isolation, tmp_path):
    """A setuid-root copy of `id` in a dir the sandbox may read: no_new_privs (set with the
    user switch, also without the OS layer) keeps the sandbox at its own uid."""
    bindir = tmp_path / "suid"
    bindir.mkdir()
    suid = bindir / "id"
    shutil.copy2("/usr/bin/id", suid)
    os.chown(suid, 0, 0)
    os.chmod(suid, 0o4755)
    r = pipguard(["run", "--isolation", isolation, "--allow-read", str(bindir), "--", str(suid), "-u"],
                 cwd=work, env=fake_home.env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(r.report["host"]["sandbox_uid"]) != "0"


@requires("root")
def test_doctor_names_the_sandbox_user(work, fake_home):
    r = subprocess.run([PY, "-m", "pipguard", "doctor", "--format", "json"], cwd=work, env=fake_home.env(),
                       capture_output=True, text=True)
    data = json.loads(r.stdout)
    (check,) = [c for c in data["checks"] if c["name"] == "sandbox_user"]
    assert check["status"] == "ok" and f"{sandbox_user.UIDS.start}" in check["detail"], check


# --- pip's shape: 0700 root temp dirs, grants undone --------------------------------------------


@requires("root")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_pip_style_dirs_are_granted_and_restored(isolation):
    """What `pipguard install` will do per PEP 517 hook call: cwd = pip's unpacked source in a
    0700 /tmp/pip-install-*, allow_write = [hook control dir, output dir] (0700 pip-* dirs),
    allow_read = [build-env prefix in a 0700 /tmp/pip-build-env-*]. The hook reads a 0600 source
    file and the build env, writes its output; afterwards root reads it and every mode, owner
    and ACL is as before."""
    base = tempfile.mkdtemp(prefix="pipguard-test-pipshape-")  # 0700, root
    try:
        src = Path(base, "pip-install-abc", "pkg_0123")
        src.mkdir(parents=True)
        os.chmod(src.parent, 0o700)
        (src / "setup.cfg").write_text("[metadata]\nname = pkg\n")
        os.chmod(src / "setup.cfg", 0o600)  # an sdist may say so; the build must still read it
        (src / "pkg.egg-info").mkdir()
        (src / "pkg.egg-info" / "PKG-INFO").write_text("old\n")  # rewritten in place by the build
        env = Path(base, "pip-build-env-xyz", "overlay", "lib")
        env.mkdir(parents=True)
        os.chmod(env.parent.parent, 0o700)
        (env / "backend.py").write_text("VALUE = 'from-build-env'\n")
        control = Path(base, "pip-hook-ctl")
        out = Path(base, "pip-wheel-out")
        for d in (control, out):
            d.mkdir(mode=0o700)
        (control / "input.json").write_text('{"hook": "build_wheel"}')
        before = _tree_state(base)
        code = textwrap.dedent(f"""
            import json, os, sys
            sys.path.insert(0, {str(env)!r})
            import backend
            cfg = open("setup.cfg").read()
            open("pkg.egg-info/PKG-INFO", "w").write("new\\n")
            os.makedirs("build/lib", exist_ok=True)
            hook = json.load(open({str(control / 'input.json')!r}))
            open({str(out / 'pkg-1.0-py3-none-any.whl')!r}, "w").write(backend.VALUE + cfg)
            json.dump({{"return_val": "pkg-1.0-py3-none-any.whl", "hook": hook["hook"]}},
                      open({str(control / 'output.json')!r}, "w"))
        """)
        policy = Policy(isolation=isolation, allow_write=(str(control), str(out)), allow_read=(str(env.parent),))
        report = run([PY, "-c", code], policy, cwd=str(src), env=support.clean_env(base))
        assert report.exit_code == 0, report.to_json()
        assert report.host["sandbox_uid"] in sandbox_user.UIDS
        # root (pip) reads what the hook wrote
        assert (out / "pkg-1.0-py3-none-any.whl").read_text().startswith("from-build-env[metadata]")
        assert json.loads((control / "output.json").read_text())["hook"] == "build_wheel"
        assert (src / "pkg.egg-info" / "PKG-INFO").read_text() == "new\n"
        after = _tree_state(base)
        for path, was in before.items():
            assert after[path] == was, (path, was, after[path])
        for path, (mode, uid, gid, xattr) in after.items():
            assert uid not in sandbox_user.UIDS and gid not in sandbox_user.UIDS, path
            assert not _named_sandbox_uid(path), path
            if path.startswith(base):
                assert not mode & (stat.S_ISUID | stat.S_IWOTH), path
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- what the sandbox leaves behind -------------------------------------------------------------


@requires("root")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_files_left_by_the_sandbox_are_given_back_and_normalised(work, fake_home, isolation):
    """setuid, setgid, world-writable, an ACL naming its own uid, a default ACL, and a
    symlink to /etc/shadow (which the restore must not follow)."""
    shadow = os.lstat("/etc/shadow") if os.path.exists("/etc/shadow") else None
    script = work / "leave.py"
    script.write_text(textwrap.dedent("""
        import os, struct
        uid = os.getuid()

        def chmod(path, mode):  # the OS layer refuses setuid/setgid bits in the kernel (reported)
            try:
                os.chmod(path, mode)
            except PermissionError:
                os.chmod(path, mode & 0o777)

        open("suid", "w").write("x"); chmod("suid", 0o4777)
        open("public", "w").write("x"); chmod("public", 0o666)
        os.mkdir("sgid"); chmod("sgid", 0o2777)
        open("acl", "w").write("x")
        # user::rw- user:<me>:rwx group::r-- mask::rwx other::r--
        entries = [(1, 6, 0xFFFFFFFF), (2, 7, uid), (4, 4, 0xFFFFFFFF), (0x10, 7, 0xFFFFFFFF), (0x20, 4, 0xFFFFFFFF)]
        raw = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
        os.setxattr("acl", "system.posix_acl_access", raw)
        os.setxattr("sgid", "system.posix_acl_default", raw.replace(struct.pack("<HHI", 1, 6, 0xFFFFFFFF), struct.pack("<HHI", 1, 7, 0xFFFFFFFF)))
        os.symlink("/etc/shadow", "shadow-link")
        print("done")
    """))
    r = pipguard(["run", "--isolation", isolation, "--", PY, str(script)], cwd=work, env=fake_home.env())
    assert "done" in r.stdout, r.stderr
    for name in ("suid", "public", "sgid", "acl", "shadow-link"):
        st = os.lstat(work / name)
        assert (st.st_uid, st.st_gid) == (os.lstat(work).st_uid, os.lstat(work).st_gid), name
        assert not _named_sandbox_uid(work / name), name
        if not stat.S_ISLNK(st.st_mode):
            assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH), (name, oct(st.st_mode))
    if shadow is not None:
        now = os.lstat("/etc/shadow")
        assert (now.st_uid, now.st_gid, now.st_mode) == (shadow.st_uid, shadow.st_gid, shadow.st_mode)


@requires("root")
def test_files_left_in_shared_tmp_are_removed(work, fake_home):
    """Without Landlock (--isolation audit) native code can write /tmp: what the sandbox
    user leaves there would otherwise wait for the next run with the same uid."""
    name = f"pipguard-left-{uuid.uuid4().hex[:8]}"
    r = pipguard(["run", "--isolation", "audit", "--", "/bin/sh", "-c",
                  f"mkdir /tmp/{name} && echo stash > /tmp/{name}/data && echo made"],
                 cwd=work, env=fake_home.env())
    assert "made" in r.stdout, r.stderr
    assert not os.path.exists(f"/tmp/{name}")


@requires("root")
def test_shared_tmp_is_scanned_only_when_it_changed(work, fake_home, monkeypatch):
    """Release scans a shared temp dir's entries only if the dir changed since the lease (the
    sandbox user cannot set a root-owned directory's times to hide a change): a run that left
    nothing there does not pay for a busy /tmp; a run that did is cleaned. A /tmp of our own
    (root's, 1777 as /tmp is), so that no other process touches it meanwhile."""
    shared = Path(tempfile.mkdtemp(prefix="pipguard-test-sharedtmp-", dir="/tmp"))
    os.chmod(shared, 0o1777)
    monkeypatch.setattr(uidlease, "SHARED_TMP", (str(shared),))
    scanned = []
    original = uidlease._remove_owned_entries
    monkeypatch.setattr(uidlease, "_remove_owned_entries",
                        lambda d, uid, notes: scanned.append(d) or original(d, uid, notes))
    env = support.clean_env(fake_home.path)
    assert run(["/bin/true"], Policy(isolation="audit"), cwd=str(work), env=env).exit_code == 0
    assert scanned == []
    report = run(["/bin/sh", "-c", f"echo stash > {shared}/left"], Policy(isolation="audit"),
                 cwd=str(work), env=env)
    assert report.exit_code == 0, report.to_json()
    assert scanned == [str(shared)] and not (shared / "left").exists()
    shutil.rmtree(shared)


# --- what the sandbox user cannot reach ---------------------------------------------------------


@requires("root")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_sandbox_user_cannot_reach_pipguard_state(work, fake_home, isolation):
    """The lease dir (journals of every run), its own run dir (listing), reading its event
    FIFO, and another run's private dirs: the kernel refuses each (no Landlock needed)."""
    other = tempfile.mkdtemp(prefix="pipguard-")  # shaped like another run's run dir
    os.mkdir(os.path.join(other, "tmp"), 0o700)
    Path(other, "tmp", "wheel").write_text("other run's output")
    os.chown(os.path.join(other, "tmp"), sandbox_user.UIDS.stop - 1, sandbox_user.UIDS.stop - 1)
    try:
        script = work / "probe.py"
        script.write_text(textwrap.dedent(f"""
            import json, os
            state = {sandbox_user.STATE_DIRS[0]!r}
            run_dir = os.path.dirname(os.environ["TMPDIR"])
            fifo = json.loads(os.environ["PIPGUARD_HOOK"])["fifo"]
            tries = {{
                "list-state": lambda: os.listdir(state),
                "read-lease": lambda: open(os.path.join(state, "uid-%d" % os.getuid())).read(),
                "list-run-dir": lambda: os.listdir(run_dir),
                "read-fifo": lambda: os.open(fifo, os.O_RDONLY | os.O_NONBLOCK),
                "other-run": lambda: open({os.path.join(other, "tmp", "wheel")!r}).read(),
                "list-other": lambda: os.listdir({other!r}),
            }}
            for name, fn in tries.items():
                try:
                    fn()
                    print(name, "OPEN")
                except OSError as exc:
                    print(name, exc.errno)
        """))
        r = pipguard(["run", "--isolation", isolation, "--", PY, str(script)], cwd=work, env=fake_home.env())
        assert r.report is not None, r.stderr
        lines = dict(line.split() for line in r.stdout.splitlines())
        assert set(lines) == {"list-state", "read-lease", "list-run-dir", "read-fifo", "other-run", "list-other"}
        assert all(v == str(errno.EACCES) for v in lines.values()), lines
    finally:
        shutil.rmtree(other, ignore_errors=True)


# --- a pipguard killed mid-run ------------------------------------------------------------------


@requires("root")
def test_grants_of_a_killed_pipguard_are_undone_by_the_next_lease(tmp_path, fake_home):
    base = tempfile.mkdtemp(prefix="pipguard-test-killed-")
    work = Path(base, "deep", "work")
    work.mkdir(parents=True)
    os.chmod(Path(base, "deep"), 0o700)
    before = _tree_state(base)
    uid = _killed_when_started(_sleeping_run(work, "audit", fake_home), work / "started")
    assert _named_sandbox_uid(Path(base, "deep"))  # the grant stays after the kill
    # the next holder of that uid undoes the journal: kills the sleeper, removes the grants
    held = uidlease.lease(candidates=[uid])
    held.release()
    assert not [pid for pid in sandbox_user.processes_of(uid) if _cwd_under(pid, base)]
    assert not _named_sandbox_uid(Path(base, "deep"))
    after = _tree_state(base)
    for path, was in before.items():
        assert after[path] == was, (path, was, after[path])
    assert os.lstat(work / "started").st_uid == os.lstat(work).st_uid
    shutil.rmtree(base, ignore_errors=True)


def _sleeping_run(work: Path, isolation: str, fake_home) -> subprocess.Popen:
    """``pipguard run --isolation ISOLATION`` in ``work`` of a command that touches ``started``
    and sleeps."""
    return subprocess.Popen([PY, "-m", "pipguard", "run", "--isolation", isolation, "--", "/bin/sh", "-c",
                             "touch started; exec sleep 60"], cwd=work, env=fake_home.env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _killed_when_started(proc: subprocess.Popen, started: Path) -> int:
    """SIGKILL pipguard (``proc``) once its sandbox made ``started``: the leased uid (the
    file's owner). What else is in its process group (an orphaned pip) is killed after it."""
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists()
        uid = os.lstat(started).st_uid
        assert uid in sandbox_user.UIDS
    finally:
        proc.send_signal(signal.SIGKILL)  # pipguard dies without cleaning up
        proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return uid


def _cwd_under(pid: int, base: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd").startswith(base + "/")
    except OSError:
        return False  # gone


def _killed_os_run(base: str, fake_home) -> int:
    """``pipguard run --isolation os`` in ``base``/deep/work, killed with SIGKILL while its
    command runs: the leased uid, whose grants stay."""
    work = Path(base, "deep", "work")
    work.mkdir(parents=True)
    os.chmod(Path(base, "deep"), 0o700)
    uid = _killed_when_started(_sleeping_run(work, "os", fake_home), work / "started")
    assert _named_sandbox_uid(Path(base, "deep")) and _named_sandbox_uid(work)
    return uid


@requires("root")
@requires("landlock", abi=6)
@requires("seccomp_user_notif")
@pytest.mark.parametrize("then", ["doctor", "ns-run", "wheels-install"])
def test_grants_of_a_killed_pipguard_are_undone_by_any_next_pipguard(tmp_path, fake_home, then):
    """The next lease of the same uid undid a killed run's journal, but only a run that
    leases (root, --isolation os/audit): a default (ns) run, an install that ran no hook
    call, or ``doctor`` left rwx on the project and x on its ancestors. Every one of them
    replays stale journals first now; ``doctor`` says what it restored."""
    base = tempfile.mkdtemp(prefix="pipguard-test-killed-")
    try:
        before = _tree_state(base)
        uid = _killed_os_run(base, fake_home)
        other = tmp_path / "other"
        other.mkdir()
        if then == "doctor":
            r = subprocess.run([PY, "-m", "pipguard", "doctor", "--format", "json"], cwd=other,
                               env=fake_home.env(), capture_output=True, text=True, timeout=180)
            data = json.loads(r.stdout)
            restored = [x for x in data["restored"] if x["uid"] == uid]
            # Every pipguard replays stale journals as it starts: under pytest-xdist another
            # worker's may have done it first (seen with 3 workers); the grants being gone
            # (below) is then the check. Alone, doctor must have done it.
            if restored or not os.environ.get("PYTEST_XDIST_WORKER"):
                (restored_here,) = restored
                assert str(Path(base, "deep", "work")) in restored_here["paths"], restored_here
                (row,) = [c for c in data["checks"] if c["name"] == "stale_grants"]
                assert f"uid {uid}" in row["detail"], row
        elif then == "ns-run":
            r = subprocess.run([PY, "-m", "pipguard", "run", "--isolation", "ns", "--", "true"], cwd=other,
                               env=fake_home.env(), capture_output=True, text=True, timeout=180)
            assert r.returncode == 0, r.stderr
        else:  # an install that runs no sandbox at all (pip with nothing to do)
            r = subprocess.run([PY, "-m", "pipguard", "install", "--dry-run", "--no-index", "--find-links",
                                str(other), "pip"], cwd=other, env=fake_home.env(), capture_output=True,
                               text=True, timeout=180)
        # the killed run's processes are gone (under pytest-xdist another worker's run may
        # lease the freed uid meanwhile: its processes are not the killed run's)
        assert not [pid for pid in sandbox_user.processes_of(uid) if _cwd_under(pid, base)]
        assert not _named_sandbox_uid(Path(base, "deep"))
        after = _tree_state(base)
        for path, was in before.items():
            assert after[path] == was, (path, was, after[path])
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _killed_os_build(base: str, fake_home) -> int:
    """``pipguard install --sandbox --isolation os ./proj`` in ``base``/deep/work, killed with
    SIGKILL while the project's build backend runs (as the leased uid, in the project: pip
    builds a local directory in place); the ACL entries naming that uid are asserted to stay.
    pip, orphaned, is killed with it (its process group)."""
    project = Path(base, "deep", "work", "proj")
    project.mkdir(parents=True)
    os.chmod(Path(base, "deep"), 0o700)
    (project / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "slowbackend"\n'
                                            'backend-path = ["."]\n')
    (project / "slowbackend.py").write_text(textwrap.dedent("""\
        import time
        def get_requires_for_build_wheel(config_settings=None):
            open("started", "w").close()
            time.sleep(60)
            return []
        """))
    proc = subprocess.Popen([PY, "-m", "pipguard", "install", "--sandbox", "--isolation", "os", "--no-index",
                             "--target", str(Path(base, "target")), "./proj"], cwd=project.parent,
                            env=fake_home.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    uid = _killed_when_started(proc, project / "started")
    # what the kill left: the grants on the project (recursive) and on its 0700 ancestor
    assert _named_sandbox_uid(Path(base, "deep")) and _named_sandbox_uid(project)
    assert _named_sandbox_uid(project / "slowbackend.py")
    return uid


@requires("root")
@requires("landlock", abi=6)
@requires("seccomp_user_notif")
@pytest.mark.parametrize("then", ["doctor", "default-run"])
def test_grants_of_a_pipguard_killed_in_an_os_build_are_undone_by_doctor_or_a_default_run(fake_home, then):
    """Issue 30: SIGKILL during an ``--isolation os`` build left rwx on the project and x on
    its ancestors until an ``--isolation os`` run leased that same uid again; ``doctor`` and a
    default (namespace) run never replayed the journal."""
    base = tempfile.mkdtemp(prefix="pipguard-test-killed-build-")
    try:
        project = Path(base, "deep", "work", "proj")
        uid = _killed_os_build(base, fake_home)
        elsewhere = Path(base, "elsewhere")
        elsewhere.mkdir()
        if then == "doctor":
            r = subprocess.run([PY, "-m", "pipguard", "doctor"], cwd=elsewhere, env=fake_home.env(),
                               capture_output=True, text=True, timeout=180)
            (row,) = [line for line in r.stdout.splitlines() if line.startswith("stale_grants")]
            # (under pytest-xdist another worker's pipguard may have replayed it first: above)
            if f"uid {uid}" in row or not os.environ.get("PYTEST_XDIST_WORKER"):
                assert f"uid {uid}: rwx on {project}" in row, row
        else:
            r = subprocess.run([PY, "-m", "pipguard", "run", "--", "true"], cwd=elsewhere, env=fake_home.env(),
                               capture_output=True, text=True, timeout=180)
            assert r.returncode == 0, r.stderr
        assert not [pid for pid in sandbox_user.processes_of(uid) if _cwd_under(pid, base)]
        for path in (Path(base, "deep"), project, project / "slowbackend.py", project / "pyproject.toml"):
            assert not _named_sandbox_uid(path), path
        # what the build left is given back to the project's owner
        assert os.lstat(project / "started").st_uid == os.lstat(project).st_uid
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- the ACL codec ------------------------------------------------------------------------------


@requires("root")
def test_acl_grant_and_revoke_keep_an_existing_acl(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    os.chmod(f, 0o640)
    entries = [acl.Entry(acl.USER_OBJ, 6), acl.Entry(acl.USER, 6, 4242), acl.Entry(acl.GROUP_OBJ, 4),
               acl.Entry(acl.MASK, 6), acl.Entry(acl.OTHER, 0)]
    os.setxattr(f, acl.XATTR, acl.encode(entries))
    original = os.getxattr(f, acl.XATTR)
    uid = sandbox_user.UIDS.start
    assert acl.grant_user(str(f), uid, 4) is True
    now = acl.decode(os.getxattr(f, acl.XATTR))
    assert acl.Entry(acl.USER, 4, uid) in now and acl.Entry(acl.USER, 6, 4242) in now
    acl.revoke_user(str(f), uid, True)
    assert os.getxattr(f, acl.XATTR) == original


@requires("root")
def test_acl_grant_on_a_plain_file_is_undone_exactly(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    os.chmod(f, 0o600)
    assert acl.grant_user(str(f), sandbox_user.UIDS.start, 1) is False
    assert stat.S_IMODE(os.lstat(f).st_mode) == 0o610  # the mask shows in the group bits; group::--- stays
    acl.revoke_user(str(f), sandbox_user.UIDS.start, False)
    assert stat.S_IMODE(os.lstat(f).st_mode) == 0o600
    with pytest.raises(OSError) as exc:
        os.getxattr(f, acl.XATTR)
    assert exc.value.errno == errno.ENODATA


@requires("root")
def test_acl_refuses_to_widen_a_narrowing_mask(tmp_path):
    """user:4242:rwx masked to r--: adding an entry with a wider mask would give 4242 more."""
    f = tmp_path / "f"
    f.write_text("x")
    entries = [acl.Entry(acl.USER_OBJ, 6), acl.Entry(acl.USER, 7, 4242), acl.Entry(acl.GROUP_OBJ, 4),
               acl.Entry(acl.MASK, 4), acl.Entry(acl.OTHER, 0)]
    os.setxattr(f, acl.XATTR, acl.encode(entries))
    with pytest.raises(acl.AclError):
        acl.grant_user(str(f), sandbox_user.UIDS.start, 7)


@requires("root")
@pytest.mark.parametrize("where", ["build-dir", "allow-read"])
def test_a_hard_link_in_a_granted_tree_grants_nothing(tmp_path, fake_home, where):
    """A source tree (or --allow-read tree) holding a hard link to a root-only file elsewhere:
    granting the link would grant that inode. The sandbox can read neither name."""
    secret = Path(tempfile.mkdtemp(prefix="pipguard-test-secret-"), "key")
    secret.write_text("PIPGUARD-HARDLINKED-SECRET")
    os.chmod(secret, 0o600)
    tree = tmp_path / "tree"
    tree.mkdir()
    os.link(secret, tree / "innocent.txt")
    other = tmp_path / "work"
    other.mkdir()
    try:
        work = tree if where == "build-dir" else other
        extra = ["--allow-read", str(tree)] if where == "allow-read" else []
        r = pipguard(["run", "--isolation", "audit", *extra, "--", "/bin/sh", "-c",
                      f"cat {tree / 'innocent.txt'} {secret} || echo refused"], cwd=work, env=fake_home.env())
        assert "PIPGUARD-HARDLINKED-SECRET" not in r.stdout and "refused" in r.stdout, (r.stdout, r.stderr)
        assert not acl.names_user(str(secret), sandbox_user.UIDS)
        assert stat.S_IMODE(os.lstat(secret).st_mode) == 0o600
    finally:
        shutil.rmtree(secret.parent, ignore_errors=True)


@requires("root")
def test_a_read_tree_is_walked_again_only_when_it_changed(work, fake_home, monkeypatch):
    """Each hook call of an install reads the same build environment: its walk is reused while
    no directory of it changed. A file pip adds later (0600: only a grant lets the sandbox user
    read it) must be readable in the next run, and an unchanged tree is not walked again."""
    base = tempfile.mkdtemp(prefix="pipguard-test-readwalk-")  # 0700, root, like pip-build-env-*
    try:
        env = Path(base, "overlay", "lib")
        env.mkdir(parents=True)
        (env / "first.py").write_text("first")
        os.chmod(env / "first.py", 0o600)
        walks = []
        original = uidlease._walk
        monkeypatch.setattr(uidlease, "_walk", lambda top: walks.append(top) or original(top))
        policy = Policy(isolation="audit", allow_read=(base,))

        def read(name):
            report = run([PY, "-c", f"print(open({str(env / name)!r}).read())"], policy,
                         cwd=str(work), env=support.clean_env(fake_home.path))
            return report.exit_code, [e.rule for e in report.events]

        assert read("first.py") == (0, [])
        assert base in walks
        walks.clear()
        assert read("first.py") == (0, [])
        assert base not in walks  # unchanged: the remembered walk
        (env / "second.py").write_text("second")
        os.chmod(env / "second.py", 0o600)
        assert read("second.py") == (0, [])
        assert base in walks  # its directory changed: walked again, the new file granted
    finally:
        shutil.rmtree(base, ignore_errors=True)


REMOVE_TREE = textwrap.dedent("""
    import os, shutil, sys
    from pipguard.sandbox.files import remove_tree
    top = sys.argv[1]
    os.makedirs(os.path.join(top, "keep", "deeper", "k"))
    open(os.path.join(top, "keep", "deeper", "k", "x"), "w").close()
    os.chmod(os.path.join(top, "keep", "deeper"), 0o111)
    os.chmod(os.path.join(top, "keep"), 0o111)  # what a sandbox can do to its own dirs
    shutil.rmtree(top, ignore_errors=True)
    print("rmtree left", os.path.lexists(top))
    remove_tree(top)
    print("remove_tree left", os.path.lexists(top))
""")


@requires("root")
def test_a_tree_the_sandbox_closed_to_its_owner_is_removed(nobody_python):
    """Without root's override a plain rmtree skips a directory the sandbox made 0111 and leaves
    everything below it (once a setuid program of the build user in /var/tmp); pipguard's
    clean-up (``files.remove_tree``, used for each run's dir and the PKGBUILD review's) opens
    each such directory to its owner again and removes it. Run as nobody."""
    base = tempfile.mkdtemp(prefix="pipguard-remove-tree-")
    os.chmod(base, 0o755)
    try:
        os.chown(base, support.NOBODY, support.NOBODY)
        proc = support.run_as_nobody([nobody_python, "-c", REMOVE_TREE, os.path.join(base, "top")],
                                     env={"PATH": os.defpath, "PYTHONPATH": os.path.dirname(os.path.dirname(
                                         os.path.abspath(sandbox_user.__file__)))},
                                     capture_output=True, text=True, timeout=60, cwd="/")
        assert proc.returncode == 0, proc.stderr
        assert "rmtree left True" in proc.stdout and "remove_tree left False" in proc.stdout, proc.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)

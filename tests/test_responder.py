"""The supervisor's native responder (pipguard/sandbox/_responder.c) against the Python one.

The second half of this file came from a review of the responder: it found opens the
native thread answered CONTINUE where Python blocks and reports (relative paths through
symlinks, "//" and "/./", a symlink in a writable root to another process's /proc), two of
them shared with the Python fast path. Every case below failed before the fix.

The native thread answers only opens that the Python fast path answers without evidence;
everything else (here: relative and dirfd-relative opens whose base is a home, paths with
"..") must reach the Python supervisor and be blocked AND reported exactly as before. Every
case runs with both responders (``PIPGUARD_PYTHON_RESPONDER=1`` forces the Python one).
"""

from __future__ import annotations

import errno
import os

import pytest

from pg import pipguard
from support import parse_try_one, requires

pytestmark = [requires("linux"), requires("landlock", abi=6), requires("seccomp_user_notif")]


@pytest.fixture(params=["native", "python"])
def responder(request):
    if request.param == "native" and not _native_built():
        if os.environ.get("PIPGUARD_REQUIRE_ALL_LAYERS") == "1":
            pytest.fail("pipguard.sandbox._responder is not built (pip install -e . compiles it; gcc?)")
        pytest.skip("pipguard.sandbox._responder is not built")
    return request.param


def _native_built() -> bool:
    try:
        from pipguard.sandbox import _responder  # noqa: F401
    except ImportError:
        return False
    return True


def _run(responder, argv, *, work, home):
    extra = {"PIPGUARD_PYTHON_RESPONDER": "1"} if responder == "python" else {}
    r = pipguard(["run", "--isolation", "os", "--", *map(str, argv)], cwd=work,
                 env=home.env(extra))
    assert r.report is not None, r.stderr
    assert r.report["supervision"]["responder"] == responder, r.report["supervision"]
    return parse_try_one(r.stdout), r


@pytest.fixture
def work(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.mark.parametrize("action", ["read-from", "read-at"])
def test_relative_secret_read_is_blocked_and_reported(responder, action, try_one_bin, work,
                                                      fake_home):
    secret = fake_home.secrets["id_rsa"]
    # chdir into the home (chdir is not an open), or a dirfd of "/" (opening the
    # home itself would already be refused as a home read)
    base = str(fake_home.path) if action == "read-from" else "/"
    rel = os.path.relpath(secret, base)
    out, r = _run(responder, [try_one_bin, action, base, rel], work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    events = r.blocked(kind="file-read", layer="supervisor")
    assert [e["target"] for e in events] == [str(secret)], r.report["events"]
    assert events[0]["rule"] == "secret-read"
    assert fake_home.markers["id_rsa"] not in r.stdout + r.stderr


def test_dotdot_from_the_build_dir_is_blocked_and_reported(responder, try_one_bin, work, fake_home):
    secret = fake_home.secrets["id_rsa"]
    sneaky = os.path.join(str(work), os.path.relpath(secret, work))  # work/../../...
    assert "/.." in sneaky
    out, r = _run(responder, [try_one_bin, "read", sneaky], work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    assert r.targets(kind="file-read", layer="supervisor") == [str(secret)], r.report["events"]


def test_allowed_opens_pass_and_are_answered_by_the_right_responder(responder, try_one_bin, work,
                                                                     fake_home):
    (work / "src.c").write_text("int x;\n")
    for argv in ([try_one_bin, "read", "/usr/include/stdio.h"],
                 [try_one_bin, "read-from", work, "src.c"],
                 [try_one_bin, "read-at", "/usr/include", "stdio.h"]):
        out, r = _run(responder, argv, work=work, home=fake_home)
        assert out["ok"], (argv, out)
        assert not r.blocked(), r.report["events"]
        supervision = r.report["supervision"]
        assert supervision["sync_wake_up"] is True  # Linux >= 6.6 here; the ioctl takes flags by value
        # the thread ends when the last sandboxed task does: that is no error
        assert "responder_error" not in supervision, supervision
        if responder == "native":
            # the loader's and the helper's opens never reached Python
            assert supervision["answered_natively"] >= 3, supervision
            assert supervision["native_cpu_ms"] > 0, supervision
        else:
            assert supervision["answered_natively"] == 0, supervision


# --- from the review ---------------------------------------------------------------------

@pytest.mark.parametrize("action", ["read-from", "read-at"])
def test_relative_path_through_symlink_into_home_is_reported(responder, action, try_one_bin,
                                                             work, fake_home):
    """work/h -> $HOME; open("h/.ssh/id_rsa") relative to the build dir (cwd or dirfd).

    Python: relative -> realpath -> $HOME/.ssh/id_rsa -> secret-read, EACCES.
    Native: "<work>/h/.ssh/id_rsa" starts with "<work>/" (a read_fast root) -> CONTINUE;
    Landlock says EACCES, no event."""
    secret = fake_home.secrets["id_rsa"]
    (work / "h").symlink_to(fake_home.path, target_is_directory=True)
    rel = os.path.join("h", os.path.relpath(secret, fake_home.path))
    out, r = _run(responder, [try_one_bin, action, work, rel], work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    events = r.blocked(kind="file-read", layer="supervisor")
    assert [e["target"] for e in events] == [str(secret)], r.report["events"]
    assert events[0]["rule"] == "secret-read"


@requires("root")  # /etc/shadow is readable for root only (DAC); the point is Landlock + evidence
@pytest.mark.parametrize("action, base, rel", [
    ("read-from", "/etc", "./shadow"),
    ("read-at", "/etc", "./shadow"),
    ("read-at", "/", "etc//shadow"),
    ("read-at", "/", "etc/./shadow"),
])
def test_relative_dot_or_double_slash_secret_in_etc_is_reported(responder, action, base, rel,
                                                                 try_one_bin, work, fake_home):
    """never_fast has "/etc/shadow"; the joined "/etc/./shadow" or "/etc//shadow" does not
    start with it but starts with "/etc/" (read_fast) -> native CONTINUE, no evidence."""
    if not os.path.exists("/etc/shadow"):
        pytest.skip("no /etc/shadow")
    out, r = _run(responder, [try_one_bin, action, base, rel], work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    events = r.blocked(kind="file-read", layer="supervisor")
    assert [(e["target"], e["rule"]) for e in events] == [("/etc/shadow", "secret-read")], \
        r.report["events"]


# --- pre-existing in the Python fast path too (not introduced by the C, same prefix test) -----

@requires("root")
@pytest.mark.parametrize("path", ["/etc/./shadow", "/etc//shadow"])
def test_absolute_unnormalised_secret_path_is_reported(responder, path, try_one_bin, work,
                                                       fake_home):
    """Both fast paths test never_fast against the raw string: "/etc/./shadow" and
    "/etc//shadow" escape "/etc/shadow" while matching "/etc/"; EACCES comes from Landlock
    alone and no secret-read is recorded (either responder)."""
    if not os.path.exists("/etc/shadow"):
        pytest.skip("no /etc/shadow")
    out, r = _run(responder, [try_one_bin, "read", path], work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    events = r.blocked(kind="file-read", layer="supervisor")
    assert [(e["target"], e["rule"]) for e in events] == [("/etc/shadow", "secret-read")], \
        r.report["events"]


def test_relative_write_through_symlink_into_sandbox_home_is_refused(responder, try_one_bin, work,
                                                                     fake_home):
    """Not only evidence: the outcome differs. $TMPDIR/h -> $HOME (the sandbox's own HOME, a
    Landlock write root); write("h/.bashrc") relative to $TMPDIR.

    Python: relative -> realpath -> <sandbox home>/.bashrc -> "persistence", EACCES.
    Native: "<tmp>/h/.bashrc" starts with "<tmp>/" (write_fast) -> CONTINUE; Landlock
    allows the sandbox home, so the write SUCCEEDS and nothing is recorded."""
    helper = work / "try_one"  # the build dir is readable; the helper's own dir is not here
    helper.write_bytes(open(try_one_bin, "rb").read())
    helper.chmod(0o755)
    script = f'cd "$TMPDIR" && ln -s "$HOME" h && exec {helper} write h/.bashrc'
    out, r = _run(responder, ["/bin/sh", "-c", script], work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    rules = [e["rule"] for e in r.blocked(kind="file-write", layer="supervisor")]
    assert rules == ["persistence"], r.report["events"]


@pytest.mark.parametrize("action", ["read-from", "read-at"])
def test_relative_path_through_symlink_into_other_process_proc_is_refused(responder, action,
                                                                          try_one_bin, work,
                                                                          fake_home):
    """work/p -> /proc/<pid of this test process, outside the sandbox>; open("p/cmdline")
    relative to the build dir.

    Python: realpath -> /proc/<pid>/cmdline -> "proc-other-process", EACCES.
    Native: "<work>/p/cmdline" is under a read_fast root and not under "/proc/" -> CONTINUE;
    Landlock grants /proc and cmdline needs no ptrace access, so the read SUCCEEDS."""
    outside = os.getpid()
    (work / "p").symlink_to(f"/proc/{outside}", target_is_directory=True)
    out, r = _run(responder, [try_one_bin, action, work, "p/cmdline"], work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    events = r.blocked(kind="file-read", layer="supervisor")
    assert [(e["target"], e["rule"]) for e in events] == [
        (f"/proc/{outside}/cmdline", "proc-other-process")], r.report["events"]


def test_absolute_path_through_symlink_into_other_process_proc_is_refused(responder, try_one_bin,
                                                                          work, fake_home):
    """Pre-existing, both responders: the same symlink named by an ABSOLUTE path passes the
    Python fast path too ("<work>/p/cmdline" is under "<work>/", not under "/proc/"), so the
    proc-other-process refusal is bypassed deterministically by any sandboxed process that can
    create a symlink in its build dir or $TMPDIR."""
    outside = os.getpid()
    (work / "p").symlink_to(f"/proc/{outside}", target_is_directory=True)
    out, r = _run(responder, [try_one_bin, "read", work / "p" / "cmdline"], work=work,
                  home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    assert r.targets(kind="file-read", layer="supervisor") == [f"/proc/{outside}/cmdline"], \
        r.report["events"]


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_symlink_as_last_component_into_other_process_proc_is_refused(responder, how, try_one_bin,
                                                                      work, fake_home):
    """work/c -> /proc/<pid outside>/cmdline, opened as "<work>/c" or "c": the parent
    resolves to the build dir itself, so only checking the LAST component (is it a
    symlink?) sends this to Python, which follows it and refuses."""
    outside = os.getpid()
    (work / "c").symlink_to(f"/proc/{outside}/cmdline")
    argv = ([try_one_bin, "read", work / "c"] if how == "absolute"
            else [try_one_bin, "read-from", work, "c"])
    out, r = _run(responder, argv, work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    assert r.targets(kind="file-read", layer="supervisor") == [f"/proc/{outside}/cmdline"], \
        r.report["events"]


def test_a_listener_whose_tasks_all_exited_counts_as_hung_up():
    """Once the native responder ended (the command exited) the supervisor listened itself
    until the run's exit was reported; a listener no task uses polls readable at once, so
    that loop spun ~650 times a hook call, on the CPU the exit chain needed. Now such a
    listener is dropped: ``notify.hung_up`` tells it apart from a live, quiet one."""
    import pyseccomp

    from pipguard.sandbox import notify
    from pipguard.sandbox.oslayer import seccomp

    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a task with a filter that notifies on a syscall nobody makes
        try:
            os.close(ready_r)
            os.close(go_w)
            import ctypes

            ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
            f.add_rule(pyseccomp.NOTIFY, "uselib")
            listener, _degraded = seccomp.load_program(seccomp.export_program(f), listener=True)
            os.write(ready_w, b"%d\n" % listener)
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    listener = None
    try:
        fd = int(os.read(ready_r, 32))
        listener = notify.take_fd(pid, fd)
        assert not notify.hung_up(listener)  # alive, and quiet: nothing pending, not hung up
        assert notify.receive(listener) is None
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        assert notify.hung_up(listener)
        assert notify.receive(listener) is None
    finally:
        if listener is not None:
            os.close(listener)
        os.close(ready_r)
        os.close(go_w)

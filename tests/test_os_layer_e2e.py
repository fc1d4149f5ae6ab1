"""The Linux OS layer end to end: the real ``pipguard run --isolation os`` CLI against a fake HOME.

Each attack is performed for real by native code (``try_one_bin``), a shell, or an unhooked
interpreter; each test asserts the action FAILED (errno, unchanged file, nothing received) AND
the report holds the blocked event with the right kind, target and layer. ``--isolation os``
makes a missing layer an error instead of a silent degradation.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

import pg
import support
from pg import PLAIN, Result, assert_decoy_read, pipguard, run_os
from support import parse_try_one, requires

PY = sys.executable
pytestmark = [requires("linux"), requires("landlock", abi=6), requires("seccomp_user_notif")]

NATIVE = ("supervisor", "seccomp")  # layers that see native code


def try_one(bin_, action, *args, work, home, extra=(), backend=PLAIN):
    if backend.ns:  # the helper lives in a temp dir: /tmp is the namespace's own
        extra = ("--allow-read", os.path.dirname(str(bin_)), *extra)
    r = run_os([bin_, action, *args], work, home, *extra, backend=backend, complete=True)
    return parse_try_one(r.stdout), r


def blocked_native(r: Result, kind: str):
    """Blocked events of ``kind`` reported by a layer that sees native code."""
    return [e for e in r.blocked(kind=kind)
            if set(e["detail"].get("seen_by", [e["layer"]])) & set(NATIVE)]


def settle():
    time.sleep(0.3)  # a sink records a connection when it closes


# --- native code (try_one.c) ------------------------------------------------------------------


def test_native_read_secret(try_one_bin, work, fake_home, backend):
    secret = fake_home.secrets["id_rsa"]
    out, r = try_one(try_one_bin, "read", secret, work=work, home=fake_home, backend=backend)
    if backend.ns:  # a decoy is read, and reported though reads are not observed
        assert out["ok"], out
        assert_decoy_read(r, fake_home, "id_rsa", secret, printed=False)
        return
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    events = blocked_native(r, "file-read")
    assert [e["target"] for e in events] == [str(secret)], r.report["events"]
    assert events[0]["layer"] == "supervisor" and events[0]["rule"] == "secret-read"
    assert r.report["verdict"] == "blocked"
    assert fake_home.markers["id_rsa"] not in r.stdout + r.stderr


def test_native_write_bashrc(try_one_bin, work, fake_home, backend):
    out, r = try_one(try_one_bin, "write", fake_home.bashrc, work=work, home=fake_home, backend=backend)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    assert fake_home.bashrc.read_text() == fake_home.bashrc_original
    (event,) = blocked_native(r, "file-write")
    assert event["target"] == str(fake_home.bashrc)
    assert event["layer"] == "supervisor" and event["rule"] in ("persistence", "write-outside-roots")


def test_native_connect_tcp(try_one_bin, work, fake_home, loopback_tcp, backend):
    out, r = try_one(try_one_bin, "connect-tcp", "127.0.0.1", loopback_tcp.port, work=work, home=fake_home,
                     backend=backend)
    assert not out["ok"] and out["errno"] in (errno.EACCES, errno.EPERM), out
    settle()
    assert loopback_tcp.received == []
    dest = f"127.0.0.1:{loopback_tcp.port}"
    (event,) = [e for e in blocked_native(r, "network") if e["target"] == dest]
    assert event["layer"] == "supervisor" and event["detail"]["port"] == loopback_tcp.port
    assert {"family": "inet", "protocol": "tcp", "address": "127.0.0.1", "port": loopback_tcp.port,
            "action": "blocked"}.items() <= r.report["network"][0].items()


def test_native_sendto_udp(try_one_bin, work, fake_home, loopback_udp):
    out, r = try_one(try_one_bin, "sendto-udp", "127.0.0.1", loopback_udp.port, work=work, home=fake_home)
    assert not out["ok"] and out["errno"] in (errno.EPERM, errno.EACCES), out
    settle()
    assert loopback_udp.received == []
    events = blocked_native(r, "network")
    assert events, r.report["events"]
    # UDP sockets are refused at socket(): the destination is never passed to the kernel
    assert any(e["target"] in ("socket(inet, dgram)", f"127.0.0.1:{loopback_udp.port}") for e in events)
    assert r.report["network"] and r.report["network"][0]["action"] == "blocked"


@pytest.fixture
def unix_listener():
    """A unix stream socket listening in a directory outside the sandbox; ``.accepted`` counts
    connections."""
    d = tempfile.mkdtemp(prefix="pipguard-unix-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "agent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o777)
    srv.listen(4)
    srv.settimeout(0.1)
    state = {"accepted": 0, "stop": False}

    def serve():
        while not state["stop"]:
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            state["accepted"] += 1
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield path, state
    finally:
        state["stop"] = True
        t.join(2)
        srv.close()
        shutil.rmtree(d, ignore_errors=True)


def test_native_unix_connect(try_one_bin, work, fake_home, unix_listener):
    path, state = unix_listener
    out, r = try_one(try_one_bin, "unix-connect", path, work=work, home=fake_home)
    assert not out["ok"] and out["errno"] in (errno.EPERM, errno.EACCES), out
    settle()
    assert state["accepted"] == 0
    events = blocked_native(r, "network")
    assert any(e["target"] in ("socket(unix, stream)", path) for e in events), r.report["events"]


def test_native_socket_unix(try_one_bin, work, fake_home):
    out, r = try_one(try_one_bin, "socket-unix", work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EPERM, out
    (event,) = blocked_native(r, "network")
    assert event["target"] == "socket(unix, stream)" and event["layer"] == "seccomp"


@pytest.mark.parametrize("action, syscall, backend", [
    pg.backend_param("plain", "ptrace-traceme", "ptrace"), pg.backend_param("ns", "ptrace-traceme", "ptrace"),
    pg.backend_param("plain", "io-uring", "io_uring_setup")], indirect=["backend"])
def test_native_denied_syscall(try_one_bin, work, fake_home, action, syscall, backend):
    out, r = try_one(try_one_bin, action, work=work, home=fake_home, backend=backend)
    assert not out["ok"] and out["errno"] == errno.EPERM, out
    (event,) = blocked_native(r, "syscall")
    assert event["target"] == syscall and event["layer"] == "seccomp"
    assert event["detail"]["errno"] == "EPERM"


def test_native_kill_outside(try_one_bin, work, fake_home, backend):
    """Under ns the outside pid does not exist in the sandbox's pid namespace (ESRCH): the
    attempt fails by construction and there is nothing to report — the supervisor allows
    every signal there, as no pid the sandbox can name is outside (docs/sandbox.md)."""
    victim = subprocess.Popen(["sleep", "30"])
    try:
        out, r = try_one(try_one_bin, "kill", victim.pid, int(signal.SIGKILL), work=work, home=fake_home,
                         backend=backend)
        assert not out["ok"] and out["errno"] == (errno.ESRCH if backend.ns else errno.EPERM), out
        time.sleep(0.2)
        assert victim.poll() is None, "a process outside the sandbox was killed"
        if backend.ns:
            return  # not reported: impossible by construction, not refused (see the docstring)
        (event,) = blocked_native(r, "signal")
        assert event["target"] == f"pid {victim.pid}" and event["detail"]["signal"] == int(signal.SIGKILL)
    finally:
        victim.kill()
        victim.wait()


def test_native_proc_environ_of_outside_process(try_one_bin, work, fake_home, backend):
    """Under ns the namespace's /proc has no outside pid (ENOENT): impossible by construction,
    and so not reported (nothing was refused)."""
    target = f"/proc/{os.getpid()}/environ"
    out, r = try_one(try_one_bin, "read", target, work=work, home=fake_home, backend=backend)
    if backend.ns:
        assert not out["ok"] and out["errno"] == errno.ENOENT, out
        return
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    (event,) = blocked_native(r, "file-read")
    assert event["target"] == target and event["rule"] == "proc-other-process"


# --- interpreters that no hook sees -------------------------------------------------------------


def test_unhooked_python_from_shell_is_contained(work, fake_home, backend):
    secret = str(fake_home.secrets["aws"])
    code = f"print(open({secret!r}).read())"
    r = run_os(["sh", "-c", f"{PY} -I -S -c \"{code}\"; echo rc=$?"], work, fake_home, backend=backend,
               complete=True)
    assert fake_home.markers["aws"] not in r.stdout
    if backend.ns:  # no hook in that interpreter: it reads the decoy, and the decoy reports it
        assert "rc=0" in r.stdout, r.stderr
        assert_decoy_read(r, fake_home, "aws", secret)
        return
    assert "PermissionError" in r.stderr and "rc=1" in r.stdout, r.stderr
    events = blocked_native(r, "file-read")
    assert [e["target"] for e in events] == [secret], r.report["events"]
    assert events[0]["pid"] != r.report["processes"][0]["pid"]  # the grandchild, not the shell


def test_ctypes_open_is_contained_and_reported(work, fake_home):
    secret = str(fake_home.secrets["id_rsa"])
    script = work / "native.py"
    script.write_text(textwrap.dedent(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.open({secret.encode()!r}, os.O_RDONLY)
        print("fd", fd, "errno", ctypes.get_errno())
        if fd >= 0:
            print(os.read(fd, 100))
    """))
    r = run_os([PY, script], work, fake_home)
    assert fake_home.markers["id_rsa"] not in r.stdout
    assert f"fd -1 errno {errno.EACCES}" in r.stdout, (r.stdout, r.stderr)
    events = [e for e in r.blocked(kind="file-read") if e["target"] == secret]
    assert events and "supervisor" in events[0]["detail"]["seen_by"], r.report["events"]


# --- process state inside ------------------------------------------------------------------------


@requires("root")
def test_capabilities_all_zero_as_root(work, fake_home, backend):
    r = run_os(["grep", "-E", "^(Cap|NoNewPrivs|Seccomp:)", "/proc/self/status"], work, fake_home,
               backend=backend, complete=True)
    assert r.returncode == 0, r.stderr
    fields = dict(line.split(":\t", 1) for line in r.stdout.splitlines())
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[key], 16) == 0, (key, fields[key])
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"


def test_env_tokens_removed_and_keep_env(work, fake_home, backend):
    probe = ["sh", "-c", "env | sort"]
    r = run_os(probe, work, fake_home, fake_tokens=True, backend=backend, complete=True)
    assert r.returncode == 0
    for name, value in fake_home.env_markers.items():
        assert name not in r.stdout and value not in r.stdout
        assert name in r.report["env_removed"]
    assert not any(v in json.dumps(r.report) for v in fake_home.env_markers.values()), \
        "a token VALUE reached the report"
    kept = run_os(probe, work, fake_home, "--keep-env", "GITHUB_TOKEN", fake_tokens=True)
    assert f"GITHUB_TOKEN={fake_home.env_markers['GITHUB_TOKEN']}" in kept.stdout
    assert "GITHUB_TOKEN" not in kept.report["env_removed"]
    assert "NPM_TOKEN" not in kept.stdout and "NPM_TOKEN" in kept.report["env_removed"]


def test_only_stdio_descriptors_inside(work, fake_home):
    secret_fd = os.open(fake_home.secrets["id_rsa"], os.O_RDONLY)  # an inheritable fd in pipguard
    os.set_inheritable(secret_fd, True)
    try:
        # the shell lists its own descriptors (ls would add the one it reads the dir with)
        r = pg.cli(["run", "--isolation", "os", "--", "sh", "-c",
                  "ls /proc/$$/fd; cat <&%d" % secret_fd],
                 cwd=work, env=fake_home.env(), pass_fds=(secret_fd,))
    finally:
        os.close(secret_fd)
    fds = sorted(int(x) for x in r.stdout.split() if x.isdigit())
    assert fds == [0, 1, 2], (r.stdout, r.stderr)
    assert fake_home.markers["id_rsa"] not in r.stdout


def test_not_in_pipguards_session(work, fake_home):
    r = run_os([PY, "-I", "-c", "import os; print(os.getsid(0), os.getpgid(0))"], work, fake_home)
    sid, pgid = map(int, r.stdout.split())
    assert sid != os.getsid(0)  # pipguard runs in ours
    root = r.report["processes"][0]["pid"]
    assert sid == root and pgid == root


# --- what must still work -------------------------------------------------------------------------


@requires("gcc")
def test_compile_and_run_c_in_build_dir(work, fake_home):
    (work / "hello.c").write_text('#include <stdio.h>\nint main(void){puts("hello from C");return 0;}\n')
    r = run_os(["sh", "-c", "gcc -O0 -o hello hello.c && ./hello"], work, fake_home)
    assert r.returncode == 0, r.stderr
    assert "hello from C" in r.stdout
    assert r.report["verdict"] == "clean", r.blocked()


def test_configure_style_script(work, fake_home):
    (work / "configure").write_text(textwrap.dedent("""\
        #!/bin/sh
        set -e
        mkdir -p build/conftest
        cat > build/conftest/check.sh <<'EOF'
        #!/bin/sh
        echo "checking for sanity... yes"
        EOF
        chmod +x build/conftest/check.sh
        ./build/conftest/check.sh > config.log
        echo '#define HAVE_SANITY 1' > config.h
        sed -e 's/@VERSION@/1.0/' > Makefile <<'EOF'
        VERSION = @VERSION@
        EOF
        cat config.log
        """))
    os.chmod(work / "configure", 0o755)
    r = run_os(["./configure"], work, fake_home)
    assert r.returncode == 0, r.stderr
    assert "checking for sanity... yes" in r.stdout
    assert (work / "config.h").read_text() == "#define HAVE_SANITY 1\n"
    assert (work / "Makefile").read_text() == "VERSION = 1.0\n"
    assert r.report["verdict"] == "clean", r.blocked()


@requires("gcc")
def test_pip_wheel_legit_cext_is_clean(work, fake_home, wheelhouse, corpus_sdist, tmp_path):
    sdist = corpus_sdist("legit_cext")
    r = run_os([PY, "-m", "pip", "wheel", "--no-deps", "--no-index", "--find-links", wheelhouse,
                "-w", "out", sdist], work, fake_home, "--allow-read", wheelhouse, "--allow-read", sdist)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.report["verdict"] == "clean", r.blocked()
    (wheel,) = (work / "out").glob("legit_cext-*.whl")
    target = tmp_path / "site"
    subprocess.run([PY, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True, env=support.clean_env(None), stdout=subprocess.DEVNULL)
    out = subprocess.run([PY, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                          "from legit_cext._fast import add; print(add(2, 3))", str(target)],
                         stdout=subprocess.PIPE, universal_newlines=True, check=True)
    assert out.stdout.strip() == "5"


# --- as nobody ------------------------------------------------------------------------------------


def _as_nobody(try_one_bin, action, *args, home, work):
    r = pg.cli(["run", "--isolation", "os", "--", str(try_one_bin), action, *map(str, args)],
             cwd=work, env=home.env(), runner=support.run_as_nobody)
    assert r.report is not None, r.stderr
    assert r.report["host"]["euid"] == support.NOBODY
    # unprivileged: no sandbox-user switch, the sandbox keeps the caller's uid
    assert r.report["host"]["sandbox_uid"] == support.NOBODY and "user" not in r.report["isolation"]["applied"]
    return parse_try_one(r.stdout), r


@requires("root")
def test_nobody_read_secret(try_one_bin, nobody_setup):
    home, work = nobody_setup
    secret = home.secrets["id_rsa"]
    out, r = _as_nobody(try_one_bin, "read", secret, home=home, work=work)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    assert [e["target"] for e in blocked_native(r, "file-read")] == [str(secret)]


@requires("root")
def test_nobody_supervisor_answers_opens_natively(try_one_bin, nobody_setup):
    """As a normal user the native responder must still read the sandbox's
    memory (process_vm_readv); otherwise every open silently falls back to Python."""
    home, work = nobody_setup
    out, r = _as_nobody(try_one_bin, "read", "/usr/include/stdio.h", home=home, work=work)
    assert out["ok"], out
    supervision = r.report["supervision"]
    if supervision["responder"] != "native" and os.environ.get("PIPGUARD_REQUIRE_ALL_LAYERS") != "1":
        pytest.skip("pipguard.sandbox._responder is not built")
    assert supervision["responder"] == "native" and supervision["answered_natively"] >= 1, supervision


@requires("root")
def test_nobody_write_outside(try_one_bin, nobody_setup):
    home, work = nobody_setup
    out, r = _as_nobody(try_one_bin, "write", home.bashrc, home=home, work=work)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    assert home.bashrc.read_text() == home.bashrc_original
    assert [e["target"] for e in blocked_native(r, "file-write")] == [str(home.bashrc)]


@requires("root")
def test_nobody_connect(try_one_bin, nobody_setup, loopback_tcp):
    home, work = nobody_setup
    out, r = _as_nobody(try_one_bin, "connect-tcp", "127.0.0.1", loopback_tcp.port, home=home, work=work)
    assert not out["ok"], out
    settle()
    assert loopback_tcp.received == []
    assert f"127.0.0.1:{loopback_tcp.port}" in [e["target"] for e in blocked_native(r, "network")]


@pytest.mark.parametrize("shell", ["/bin/sh", "/usr/bin/env"])
def test_command_path_never_widens_reads_to_root(tmp_path, fake_home, shell):
    """Regression: the parent of a command's bin dir was granted; for /bin/sh that is "/"."""
    work = tmp_path / "w"
    work.mkdir()
    argv = [shell, "-c", f"cat {fake_home.secrets['id_rsa']}"] if shell == "/bin/sh" else \
        [shell, "cat", str(fake_home.secrets["id_rsa"])]
    r = pipguard(["run", "--isolation", "os", "--", *argv], cwd=work, env=fake_home.env())
    assert "PIPGUARD-FAKE-SECRET" not in r.stdout
    assert r.report["verdict"] == "blocked"
    assert str(fake_home.secrets["id_rsa"]) in r.targets(kind="file-read")


INT80 = r"""
#include <stdio.h>
static long int80(long nr) {
    long ret;
    __asm__ volatile ("int $0x80" : "=a"(ret) : "a"(nr), "b"(0), "c"(0), "d"(0) : "memory");
    return ret;
}
int main(void) { printf("%ld\n", int80(26)); return 0; }  /* i386 ptrace(TRACEME) */
"""


def test_int80_foreign_abi_is_refused_and_reported(tmp_path, fake_home):
    """The 32-bit ABI bypasses a filter written for x86_64 numbers: it is refused (ENOSYS)
    and every attempt is reported."""
    import platform
    import subprocess

    if platform.machine() != "x86_64":
        pytest.skip("int 0x80 is x86 only")
    work = tmp_path / "w"
    work.mkdir()
    (work / "i80.c").write_text(INT80)
    subprocess.run(["gcc", "-O0", "-o", str(work / "i80"), str(work / "i80.c")], check=True)
    r = pipguard(["run", "--isolation", "os", "--", str(work / "i80")], cwd=work, env=fake_home.env())
    assert r.stdout.strip() == "-38", r.stdout  # -ENOSYS
    (event,) = r.blocked(kind="syscall", rule="foreign-abi")
    assert "syscall 26" in event["target"] and event["layer"] == "seccomp"


DENY_LIST_PROBE = r"""
import ctypes, errno, fcntl, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, nr, args in (("bpf", 321, (0, 0, 0)), ("unshare", 272, (0x10000000,)),
                       ("mount", 165, (0, 0, 0, 0, 0)), ("keyctl", 250, (0, 0, 0))):
    ctypes.set_errno(0)
    res = libc.syscall(nr, *args)
    out[name] = ctypes.get_errno() if res == -1 else 0
try:
    fcntl.ioctl(0, 0x5412, b"x")  # TIOCSTI
    out["ioctl"] = 0
except OSError as exc:
    out["ioctl"] = exc.errno
print(json.dumps(out))
"""


def test_deny_list_syscalls_are_refused_and_reported(tmp_path, fake_home):
    """bpf, unshare(CLONE_NEWUSER), mount, keyctl and TIOCSTI: each fails EPERM and each is in
    the report as a seccomp syscall-denied event."""
    import json
    import sys

    work = tmp_path / "w"
    work.mkdir()
    (work / "probe.py").write_text(DENY_LIST_PROBE)
    r = pipguard(["run", "--isolation", "os", "--", sys.executable, "-I", str(work / "probe.py")],
                 cwd=work, env=fake_home.env())
    errnos = json.loads(r.stdout.strip().splitlines()[-1])
    assert errnos == {name: 1 for name in ("bpf", "unshare", "mount", "keyctl", "ioctl")}, errnos
    reported = {e["target"] for e in r.blocked(kind="syscall", rule="syscall-denied")}
    assert {"bpf", "unshare", "mount", "keyctl", "ioctl"} <= reported, reported

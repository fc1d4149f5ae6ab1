"""The OS layer on the real kernel: each test confines a fresh child, tries ONE thing, and
reads the errno back as JSON. No mocks.

Gates come from ``pipguard.sandbox.host.probe()``; with ``PIPGUARD_REQUIRE_ALL_LAYERS=1`` a missing
layer fails the test instead of skipping it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from pipguard.errors import LayerUnavailable
from pipguard.sandbox.host import probe
from pipguard.sandbox.oslayer import OsLayerSpec, apply, seccomp as oseccomp

STRICT = os.environ.get("PIPGUARD_REQUIRE_ALL_LAYERS", "") == "1"
NOBODY = 65534


def need(*features: str) -> None:
    """Skip (or fail under PIPGUARD_REQUIRE_ALL_LAYERS=1) unless every feature is present."""
    facts = probe()
    have = {
        "linux": (facts.system == "Linux", facts.platform_reason),
        "x86_64": (facts.machine == "x86_64", f"machine is {facts.machine}"),
        "landlock": (facts.landlock_abi >= 1, facts.landlock_reason),
        "landlock.refer": (facts.landlock_abi >= 2, f"Landlock ABI {facts.landlock_abi} < 2"),
        "landlock.net": (facts.landlock_net, f"Landlock ABI {facts.landlock_abi} < 4"),
        "landlock.scope": (facts.landlock_scope, f"Landlock ABI {facts.landlock_abi} < 6"),
        "seccomp": (facts.seccomp, facts.seccomp_reason),
        "seccomp.notify": (facts.seccomp_notify, facts.seccomp_notify_reason),
        "root": (facts.euid == 0, f"euid {facts.euid}"),
        "gcc": (shutil.which("gcc") is not None, "gcc not on PATH"),
    }
    for feature in features:
        ok, why = have[feature]
        if not ok:
            msg = f"needs {feature}: {why}"
            if STRICT:
                pytest.fail(msg + " (PIPGUARD_REQUIRE_ALL_LAYERS=1)", pytrace=False)
            pytest.skip(msg)


ALL = ("landlock", "landlock.net", "landlock.scope", "seccomp")


def _system_read_paths() -> List[str]:
    paths = {"/usr", "/lib", "/lib64", "/bin", "/etc"}
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        paths.add(os.path.realpath(p))
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        paths.add(os.path.realpath(sysconfig.get_paths()[key]))
    import pipguard

    paths.add(os.path.dirname(os.path.dirname(os.path.realpath(pipguard.__file__))))
    return sorted(paths)


def make_spec(**kw: Any) -> OsLayerSpec:
    base: Dict[str, Any] = dict(
        read_paths=tuple(_system_read_paths()),
        write_paths=(),
        device_paths=("/dev/null", "/dev/zero", "/dev/urandom"),
        network="none",
        notify=False,
    )
    base.update(kw)
    return OsLayerSpec(**base)


# The child: imports everything first (Landlock may hide the stdlib afterwards), applies the
# OS layer, tries exactly one action and prints {"errno": N, ...} on stdout.
CHILD = r'''
import ctypes, errno, json, os, signal, socket, sys, threading
from pipguard.sandbox.oslayer import OsLayerSpec, apply
req = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def sc(nr, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a & 0xFFFFFFFFFFFFFFFF) for a in args])
    return 0 if rc >= 0 else ctypes.get_errno()

def oserr(fn):
    try:
        out = fn()
    except OSError as exc:
        return {"errno": exc.errno}
    return {"errno": 0, "value": out}

def do_read(p):
    with open(p, "rb") as f:
        return f.read().decode(errors="replace")

def do_write(p):
    with open(p, "w") as f:
        f.write("x")

def do_tcp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(b"LEAK")
    s.close()

def do_udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"LEAK", ("127.0.0.1", port))

def do_socket(args):
    s = socket.socket(*args)
    s.close()

def do_fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

def do_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(os.getpid()))
    t.start(); t.join()
    return out

def do_exec(argv):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        os.execv(argv[0], argv)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
    _, status = os.waitpid(pid, 0)
    return {"status": status, "out": data.decode()}

actions = {
    "read": lambda a: oserr(lambda: do_read(a)),
    "write": lambda a: oserr(lambda: do_write(a)),
    "rename": lambda a: oserr(lambda: os.rename(a[0], a[1])),
    "link": lambda a: oserr(lambda: os.link(a[0], a[1])),
    "tcp": lambda a: oserr(lambda: do_tcp(a)),
    "udp": lambda a: oserr(lambda: do_udp(a)),
    "socket": lambda a: oserr(lambda: do_socket(a)),
    "socketpair": lambda a: oserr(lambda: [s.close() for s in socket.socketpair(socket.AF_UNIX)]),
    "syscall": lambda a: {"errno": sc(*a)},
    "kill": lambda a: oserr(lambda: os.kill(a[0] if a[0] else os.getppid(), a[1])),
    "fork": lambda a: oserr(do_fork),
    "thread": lambda a: oserr(do_thread),
    "exec": lambda a: oserr(lambda: do_exec(a)),
    "caps": lambda a: oserr(lambda: do_read("/proc/thread-self/status")),
    "none": lambda a: {"errno": 0},
}
st = apply(OsLayerSpec.from_json(req["spec"]), required=req["required"])
result = actions[req["action"]](req.get("arg"))
result["applied"] = list(st.applied)
result["unavailable"] = st.unavailable
sys.stdout.write(json.dumps(result) + "\n")
sys.stdout.flush()
'''


def run_child(spec: OsLayerSpec, action: str, arg: Any = None, *, required: bool = True, timeout: float = 60) -> Dict[str, Any]:
    req = {"spec": spec.to_json(), "action": action, "arg": arg, "required": required}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(req)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
        cwd="/",
    )
    assert proc.returncode == 0, f"child failed ({proc.returncode}): {proc.stderr.decode()[-3000:]}"
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


@pytest.fixture
def tree(tmp_path: Path) -> Dict[str, Path]:
    """A fake home with a planted secret, a read-only dir and a writable work dir."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("FAKE-SECRET")
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "data.txt").write_text("readable")
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("mine")
    return {"home": home, "ro": ro, "work": work, "root": tmp_path}


def fs_spec(tree: Dict[str, Path], **kw: Any) -> OsLayerSpec:
    return make_spec(read_paths=tuple(_system_read_paths()) + (str(tree["ro"]),), write_paths=(str(tree["work"]),), **kw)


# --- spec and status ---------------------------------------------------------------------------


def test_spec_json_roundtrip() -> None:
    spec = make_spec(network="ports", tcp_connect_ports=(443, 80), allow_subprocess=False, observe_reads=True)
    again = OsLayerSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec
    with pytest.raises(ValueError):
        OsLayerSpec.from_json({**spec.to_json(), "surprise": 1})
    with pytest.raises(ValueError):
        make_spec(network="some")


def test_applied_status_names_every_part() -> None:
    need(*ALL)
    out = run_child(make_spec(), "none")
    assert out["applied"] == ["no_new_privs", "capabilities", "landlock.fs", "landlock.net", "landlock.scope", "seccomp"]
    assert out["unavailable"] == {}


def test_required_raises_before_changing_anything_when_a_part_is_missing(monkeypatch) -> None:
    need("linux")
    from pipguard.sandbox.oslayer import landlock

    monkeypatch.setattr(landlock, "abi_version", lambda: (3, ""))  # pretend Linux 6.2
    spec = make_spec(network="ports", tcp_connect_ports=(443,))
    with pytest.raises(LayerUnavailable) as exc:
        apply(spec, required=True)
    assert "landlock.net" in str(exc.value) and "ABI 3 < 4" in str(exc.value)
    # nothing was applied to this (test) process
    with open("/proc/self/status") as f:
        assert "NoNewPrivs:\t0" in f.read()


# --- filesystem (Landlock) ----------------------------------------------------------------------


def test_read_outside_read_paths_is_denied(tree) -> None:
    need("landlock")
    out = run_child(fs_spec(tree), "read", str(tree["home"] / ".ssh" / "id_rsa"))
    assert out["errno"] == errno.EACCES


def test_read_inside_read_paths_works(tree) -> None:
    need("landlock")
    out = run_child(fs_spec(tree), "read", str(tree["ro"] / "data.txt"))
    assert out == {**out, "errno": 0, "value": "readable"}


def test_write_outside_write_paths_is_denied(tree) -> None:
    need("landlock")
    assert run_child(fs_spec(tree), "write", str(tree["ro"] / "new.txt"))["errno"] == errno.EACCES
    assert run_child(fs_spec(tree), "write", str(tree["ro"] / "data.txt"))["errno"] == errno.EACCES
    assert run_child(fs_spec(tree), "write", str(tree["home"] / ".bashrc"))["errno"] == errno.EACCES
    assert not (tree["home"] / ".bashrc").exists()
    assert (tree["ro"] / "data.txt").read_text() == "readable"


def test_write_inside_write_paths_works(tree) -> None:
    need("landlock")
    assert run_child(fs_spec(tree), "write", str(tree["work"] / "new.txt"))["errno"] == 0
    assert (tree["work"] / "new.txt").read_text() == "x"


def test_device_paths_allow_truncating_open(tree) -> None:
    need("landlock")
    # a shell's "> /dev/null" opens with O_TRUNC, which Landlock checks as TRUNCATE
    assert run_child(fs_spec(tree), "write", "/dev/null")["errno"] == 0


def test_rename_and_link_into_read_only_dir_are_denied(tree) -> None:
    need("landlock.refer")
    src = str(tree["work"] / "mine.txt")
    out = run_child(fs_spec(tree), "rename", [src, str(tree["ro"] / "moved.txt")])
    assert out["errno"] in (errno.EACCES, errno.EXDEV), out
    out = run_child(fs_spec(tree), "link", [src, str(tree["ro"] / "linked.txt")])
    assert out["errno"] in (errno.EACCES, errno.EXDEV), out
    # moving a file out of the read-only dir needs REMOVE_FILE there
    out = run_child(fs_spec(tree), "rename", [str(tree["ro"] / "data.txt"), str(tree["work"] / "stolen.txt")])
    assert out["errno"] in (errno.EACCES, errno.EXDEV), out
    assert sorted(p.name for p in tree["ro"].iterdir()) == ["data.txt"]
    # inside the write root, rename works
    out = run_child(fs_spec(tree), "rename", [src, str(tree["work"] / "renamed.txt")])
    assert out["errno"] == 0


# --- network ------------------------------------------------------------------------------------


def test_tcp_connect_denied_with_network_none(loopback_tcp) -> None:
    need("seccomp")
    out = run_child(make_spec(network="none"), "tcp", loopback_tcp.port)
    assert out["errno"] == errno.EPERM  # socket() itself is refused
    time.sleep(0.2)
    assert loopback_tcp.received == []


def test_tcp_connect_ports_only_the_allowed_port(loopback_tcp) -> None:
    need("seccomp", "landlock.net")
    out = run_child(make_spec(network="ports", tcp_connect_ports=(loopback_tcp.port % 65535 + 1,)), "tcp", loopback_tcp.port)
    assert out["errno"] == errno.EACCES  # Landlock refuses connect() to a port without a rule
    assert loopback_tcp.received == []
    out = run_child(make_spec(network="ports", tcp_connect_ports=(loopback_tcp.port,)), "tcp", loopback_tcp.port)
    assert out["errno"] == 0
    assert loopback_tcp.wait(1) and loopback_tcp.data() == b"LEAK"


def test_udp_sendto_denied(loopback_udp) -> None:
    need("seccomp")
    for mode in ("none", "ports"):
        out = run_child(make_spec(network=mode, tcp_connect_ports=(53,) if mode == "ports" else ()), "udp", loopback_udp.port)
        assert out["errno"] == errno.EPERM, mode
    time.sleep(0.2)
    assert loopback_udp.received == []


@pytest.mark.parametrize("network", ["none", "ports", "all"])
def test_unix_socket_denied_socketpair_allowed(network) -> None:
    need("seccomp")
    spec = make_spec(network=network)
    assert run_child(spec, "socket", [socket.AF_UNIX, socket.SOCK_STREAM])["errno"] == errno.EPERM
    assert run_child(spec, "socketpair")["errno"] == 0


def test_socket_matrix_network_all() -> None:
    need("seccomp")
    spec = make_spec(network="all")
    ok = [
        [socket.AF_INET, socket.SOCK_STREAM],
        [socket.AF_INET6, socket.SOCK_DGRAM],
        [socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK],
        [socket.AF_NETLINK, socket.SOCK_RAW, 0],  # NETLINK_ROUTE, as glibc's getaddrinfo uses it
    ]
    denied = [
        [socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP],
        [socket.AF_INET6, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.IPPROTO_ICMPV6],
        [socket.AF_PACKET, socket.SOCK_RAW, 0],
        [socket.AF_NETLINK, socket.SOCK_RAW, 9],  # NETLINK_AUDIT
        [socket.AF_UNIX, socket.SOCK_DGRAM],
    ]
    for args in ok:
        assert run_child(spec, "socket", args)["errno"] == 0, args
    for args in denied:
        assert run_child(spec, "socket", args)["errno"] == errno.EPERM, args


def test_socket_matrix_network_ports() -> None:
    need("seccomp")
    spec = make_spec(network="ports", tcp_connect_ports=(443,))
    assert run_child(spec, "socket", [socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK])["errno"] == 0
    assert run_child(spec, "socket", [socket.AF_INET6, socket.SOCK_STREAM])["errno"] == 0
    for args in ([socket.AF_INET, socket.SOCK_DGRAM], [socket.AF_INET, socket.SOCK_RAW, 1], [socket.AF_NETLINK, socket.SOCK_RAW, 0]):
        assert run_child(spec, "socket", args)["errno"] == errno.EPERM, args


def test_socket_domain_with_high_bits_is_denied() -> None:
    need("seccomp", "x86_64")
    # socket(2) takes an int: 0x1_00000002 would be AF_INET to the kernel. The filter compares
    # all 64 bits and treats such values as "not allowed".
    for mode in ("ports", "all"):
        out = run_child(make_spec(network=mode), "syscall", [41, (1 << 32) | socket.AF_UNIX, socket.SOCK_STREAM, 0])
        assert out["errno"] == errno.EPERM, mode
        out = run_child(make_spec(network=mode), "syscall", [41, (1 << 32) | socket.AF_INET, socket.SOCK_STREAM, 0])
        assert out["errno"] == errno.EPERM, mode


# --- seccomp deny-list --------------------------------------------------------------------------

# x86_64 numbers; arguments are harmless even if a rule were missing.
DENIED_SYSCALLS = {
    "ptrace(PTRACE_TRACEME)": [101, 0, 0, 0, 0],
    "process_vm_readv": [310, 1, 0, 0, 0, 0, 0],
    "io_uring_setup": [425, 1, 0],
    "unshare(CLONE_NEWUSER)": [272, 0x10000000],
    "mount": [165, 0, 0, 0, 0, 0],
    "keyctl(GET_KEYRING_ID)": [250, 0, -3, 0],
    "bpf": [321, 0, 0, 0],
    "userfaultfd": [323, 0],
    "perf_event_open": [298, 0, 0, -1, -1, 0],
    "personality(ADDR_NO_RANDOMIZE)": [135, 0x0040000],
    "personality(high bits)": [135, 1 << 32],
    "ioctl(TIOCSTI)": [16, 0, 0x5412, 0],
    "ioctl(TIOCSTI | high bits)": [16, 0, (1 << 32) | 0x5412, 0],
    "ioctl(TIOCLINUX)": [16, 0, 0x541C, 0],
    "pidfd_getfd": [438, 0, 0, 0],
    "open_by_handle_at": [304, 0, 0, 0],
}


@pytest.mark.parametrize("name", sorted(DENIED_SYSCALLS))
def test_denied_syscall_gets_eperm(name) -> None:
    need("seccomp", "x86_64")
    out = run_child(make_spec(), "syscall", DENIED_SYSCALLS[name])
    assert out["errno"] == errno.EPERM, out


def test_clone3_gets_enosys_and_allowed_personality_works() -> None:
    need("seccomp", "x86_64")
    assert run_child(make_spec(), "syscall", [435, 0, 0])["errno"] == errno.ENOSYS
    assert run_child(make_spec(), "syscall", [135, 0xFFFFFFFF])["errno"] == 0  # query
    assert run_child(make_spec(), "syscall", [135, 0])["errno"] == 0  # PER_LINUX


def test_x32_syscall_fails() -> None:
    need("seccomp", "x86_64")
    out = run_child(make_spec(), "syscall", [0x40000000 | 39])  # x32 getpid
    assert out["errno"] == errno.ENOSYS
    # Many kernels lack CONFIG_X86_X32_ABI (then ENOSYS proves nothing), so also check the
    # filter program itself: right after the arch check, nr >= 0x40000000 goes to the
    # bad-arch action ERRNO(ENOSYS).
    import struct

    f = oseccomp.build_filter(make_spec(), notify=False)
    with tempfile.TemporaryFile() as tmp:
        f.export_bpf(tmp)
        tmp.seek(0)
        data = tmp.read()
    prog = [struct.unpack("<HBBI", data[i : i + 8]) for i in range(0, len(data), 8)]
    assert prog[1][0] == 0x15 and prog[1][3] == 0xC000003E  # jeq AUDIT_ARCH_X86_64
    jge = [i for i, (code, _jt, _jf, k) in enumerate(prog[:6]) if code == 0x35 and k == 0x40000000]
    assert jge, prog[:6]
    # follow the program from there with the x32 getpid in the accumulator (libseccomp lays
    # the jumps out by the filter's size: the return is not always within a few instructions)
    nr, at = 0x40000000 | 39, jge[0]
    for _ in range(len(prog)):
        code, jt, jf, k = prog[at]
        if code == 0x06:  # ret k
            break
        taken = {0x15: nr == k, 0x35: nr >= k, 0x25: nr > k, 0x45: bool(nr & k)}.get(code)
        assert taken is not None, (at, prog[at])  # only jumps on the syscall number before the return
        at += 1 + (jt if taken else jf)
    assert prog[at] == (0x06, 0, 0, 0x00050000 | errno.ENOSYS), (at, prog[at])


INT80_C = r"""
#include <stdio.h>
#include <unistd.h>
static long int80(long nr, long a, long b, long c) {
    long ret;
    __asm__ volatile ("int $0x80" : "=a"(ret) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
    return ret;
}
int main(void) {
    /* i386 numbers: getpid 20, ptrace 26, socket 359 */
    printf("%ld %ld %ld %ld\n", (long)getpid(), int80(20, 0, 0, 0), int80(26, 0, 0, 0), int80(359, 2, 1, 0));
    return 0;
}
"""


def test_int80_i386_syscalls_fail(tmp_path) -> None:
    need("seccomp", "x86_64", "gcc")
    src, exe = tmp_path / "int80.c", tmp_path / "int80"
    src.write_text(INT80_C)
    subprocess.run(["gcc", "-O0", "-o", str(exe), str(src)], check=True, capture_output=True)
    control = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    spec = make_spec(read_paths=tuple(_system_read_paths()) + (str(tmp_path),))
    out = run_child(spec, "exec", [str(exe)])
    assert out["errno"] == 0, out
    pid, getpid32, ptrace32, socket32 = (int(x) for x in out["value"]["out"].split())
    assert getpid32 == ptrace32 == socket32 == -errno.ENOSYS, out
    if int(control[1]) == int(control[0]):  # the kernel has IA32 emulation: the bypass was real
        assert int(control[2]) == 0 and int(control[3]) >= 0


# --- signals (Landlock scoping) -----------------------------------------------------------------


def test_signals_out_of_the_sandbox_are_denied() -> None:
    need("landlock.scope")
    victim = subprocess.Popen(["sleep", "30"])
    try:
        out = run_child(make_spec(), "kill", [victim.pid, signal.SIGTERM])
        assert out["errno"] == errno.EPERM
        assert victim.poll() is None
        assert run_child(make_spec(), "kill", [0, 0])["errno"] == errno.EPERM  # kill(getppid(), 0)
        assert run_child(make_spec(), "kill", [1, 0])["errno"] == errno.EPERM  # signal 0: never harms init
    finally:
        victim.kill()
        victim.wait()


# --- capabilities -------------------------------------------------------------------------------


def test_root_has_no_capabilities_after_apply() -> None:
    need("root", "landlock")
    spec = make_spec(read_paths=tuple(_system_read_paths()) + ("/proc",))
    out = run_child(spec, "caps")
    assert out["errno"] == 0, out
    fields = dict(line.split(":\t", 1) for line in out["value"].splitlines() if ":\t" in line)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[key], 16) == 0, (key, fields[key])
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"


# --- subprocesses -------------------------------------------------------------------------------


def test_deny_subprocess_blocks_fork_but_not_threads() -> None:
    need("seccomp")
    spec = make_spec(allow_subprocess=False)
    assert run_child(spec, "fork")["errno"] == errno.EPERM
    out = run_child(spec, "thread")
    assert out["errno"] == 0 and len(out["value"]) == 1
    assert run_child(spec, "exec", ["/bin/true"])["errno"] == errno.EPERM
    assert run_child(make_spec(), "fork")["errno"] == 0


# --- unprivileged -------------------------------------------------------------------------------


def test_apply_works_as_nobody() -> None:
    """Fork, become nobody, apply(): the interpreter is already loaded, so /root's 0700 is no issue."""
    need("root", *ALL)
    base = tempfile.mkdtemp(prefix="pipguard-nobody-")
    try:
        os.chmod(base, 0o755)
        ro, work, secret = (os.path.join(base, n) for n in ("ro", "work", "secret"))
        os.mkdir(ro, 0o755)
        os.mkdir(work)
        os.chmod(work, 0o777)  # mkdir's mode goes through the umask
        with open(secret, "w") as f:
            f.write("FAKE")
        os.chmod(secret, 0o644)
        spec = make_spec(read_paths=(ro,), write_paths=(work,))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
                st = apply(spec, required=True)
                res: Dict[str, Any] = {"applied": list(st.applied)}
                try:
                    open(secret).read()
                    res["read"] = 0
                except OSError as exc:
                    res["read"] = exc.errno
                try:
                    with open(os.path.join(work, "out.txt"), "w") as f:
                        f.write("ok")
                    res["write"] = 0
                except OSError as exc:
                    res["write"] = exc.errno
                try:
                    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    res["socket"] = 0
                except OSError as exc:
                    res["socket"] = exc.errno
                os.write(w, json.dumps(res).encode())
            except BaseException as exc:  # noqa: BLE001
                os.write(w, json.dumps({"error": repr(exc)}).encode())
            finally:
                os._exit(0)
        os.close(w)
        data = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        res = json.loads(data)
        assert "error" not in res, res
        assert res["applied"] == ["no_new_privs", "capabilities", "landlock.fs", "landlock.net", "landlock.scope", "seccomp"]
        assert res["read"] == errno.EACCES and res["write"] == 0 and res["socket"] == errno.EPERM
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- user notification --------------------------------------------------------------------------


class Responder(threading.Thread):
    """The supervisor's part in miniature: answer every notification, record (nr, name, role)."""

    def __init__(self, fd: int, spec: OsLayerSpec) -> None:
        super().__init__(daemon=True)
        self.fd, self.spec = fd, spec
        self.seen: List[tuple] = []
        self.args: List[tuple] = []
        self.stop = threading.Event()

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while not self.stop.is_set():
            events = poller.poll(100)
            if not events:
                continue
            if events[0][1] & select.POLLHUP and not events[0][1] & select.POLLIN:
                return  # no task uses the filter any more
            buf = bytearray(ctypes.sizeof(oseccomp.Notif))
            try:
                fcntl.ioctl(self.fd, oseccomp.SECCOMP_IOCTL_NOTIF_RECV, buf)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.EINTR):
                    continue
                return
            notif = oseccomp.Notif.from_buffer(buf)
            name, role = oseccomp.classify(notif.data.nr, self.spec)
            self.seen.append((notif.data.nr, name, role, notif.pid, notif.data.arch))
            self.args.append(tuple(notif.data.args))
            resp = oseccomp.NotifResp(notif.id, 0, 0, 0)
            if role == "deny":
                resp.error = -oseccomp.DENY_ERRNO.get(name, errno.EPERM)
            else:
                resp.flags = oseccomp.SECCOMP_USER_NOTIF_FLAG_CONTINUE
            try:
                fcntl.ioctl(self.fd, oseccomp.SECCOMP_IOCTL_NOTIF_SEND, bytearray(resp))
            except OSError:
                pass  # the task died meanwhile (ENOENT)


NOTIFY_CHILD = r'''
import ctypes, json, os, sys
from pipguard.sandbox.oslayer import OsLayerSpec, apply
spec = OsLayerSpec.from_json(json.loads(sys.argv[1]))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
st = apply(spec, required=True)
# Hand over with write/read only: both are never notified.
os.write(1, (json.dumps({"fd": st.listener_fd, "applied": list(st.applied)}) + "\n").encode())
os.read(0, 1)
os.close(st.listener_fd)
ctypes.set_errno(0)
rc = libc.syscall(ctypes.c_long(101), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
os.write(1, (json.dumps({"ptrace": ctypes.get_errno() if rc < 0 else 0}) + "\n").encode())
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT, 0o644)
os.close(fd)
pid = os.fork()
if pid == 0:
    os._exit(0)
os.write(1, (json.dumps({"forked": pid}) + "\n").encode())
os.waitpid(pid, 0)
os.execv("/bin/true", ["true"])
'''


@pytest.mark.parametrize("observe_reads", [False, True])
def test_notify_reports_denied_ptrace_and_observed_execve(tmp_path, observe_reads) -> None:
    need("seccomp.notify", *ALL)
    spec = make_spec(notify=True, write_paths=(str(tmp_path),), observe_reads=observe_reads)
    target = tmp_path / "written.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", NOTIFY_CHILD, json.dumps(spec.to_json()), str(target)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
    )
    responder: Optional[Responder] = None
    try:
        hello = json.loads(proc.stdout.readline())
        assert "seccomp.notify" in hello["applied"]
        fd = oseccomp.take_listener(proc.pid, hello["fd"])
        assert not os.get_inheritable(fd)
        responder = Responder(fd, spec)
        responder.start()
        proc.stdin.write(b"x")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert json.loads(line) == {"ptrace": errno.EPERM}, proc.stderr.read()
        forked = json.loads(proc.stdout.readline())["forked"]
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if responder is not None:
            responder.stop.set()
            responder.join(5)
            os.close(responder.fd)
    names = [(nr, name, role) for nr, name, role, _pid, _arch in responder.seen]
    assert (101, "ptrace", "deny") in names
    assert (oseccomp._nr("openat"), "openat", "observe") in names  # the O_CREAT open
    assert (59, "execve", "observe") in names
    assert any(name == "exit_group" for _, name, _ in names)
    assert (56, "clone", "observe") in names  # os.fork -> clone without CLONE_THREAD
    assert target.exists()
    # the child's pid is the one notified; reads are observed only with observe_reads
    assert {pid for *_, pid, _arch in responder.seen} == {proc.pid, forked}
    write_bits = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC
    openat_flags = [args[2] for (_nr, name, *_), args in zip(responder.seen, responder.args) if name == "openat"]
    read_only = [fl for fl in openat_flags if not fl & write_bits]
    assert bool(read_only) == observe_reads, openat_flags


def test_notify_sendmsg_handoff_would_deadlock() -> None:
    """Documents why the listener goes to the parent via pidfd_getfd: SCM_RIGHTS needs sendmsg,
    which is itself notified, and nobody can answer before the fd has arrived."""
    need("seccomp.notify", *ALL)
    spec = make_spec(notify=True, network="none")
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX)
    code = r'''
import json, os, socket, sys
from pipguard.sandbox.oslayer import OsLayerSpec, apply
st = apply(OsLayerSpec.from_json(json.loads(sys.argv[1])), required=True)
s = socket.socket(fileno=int(sys.argv[2]))
socket.send_fds(s, [b"fd"], [st.listener_fd])
os.write(1, b"sent\n")
'''
    proc = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(spec.to_json()), str(child_sock.fileno())],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(child_sock.fileno(),), cwd="/",
    )
    child_sock.close()
    try:
        parent_sock.settimeout(2)
        with pytest.raises(socket.timeout):
            parent_sock.recv(16)
        assert proc.poll() is None  # still blocked in sendmsg
    finally:
        proc.kill()
        proc.wait()
        parent_sock.close()


def test_classify_roles() -> None:
    need("seccomp", "x86_64")
    assert oseccomp.classify(101) == ("ptrace", "deny")
    assert oseccomp.classify(59) == ("execve", "observe")
    assert oseccomp.classify(41) == ("socket", "deny")
    assert oseccomp.classify(56) == ("clone", "deny")  # without a spec: fail closed
    assert oseccomp.classify(56, make_spec()) == ("clone", "observe")
    assert oseccomp.classify(56, make_spec(allow_subprocess=False)) == ("clone", "deny")
    assert oseccomp.DENY_ERRNO["clone3"] == errno.ENOSYS and oseccomp.DENY_ERRNO["ptrace"] == errno.EPERM


def test_a_prebuilt_filter_is_keyed_by_everything_the_builder_reads():
    """The first process loads the filter the parent built before the fork (one build per
    pipguard process): the key must change with every spec field build_filter reads, or a run
    could load the filter of another policy."""
    import ast
    import inspect

    from pipguard.sandbox.oslayer import seccomp as oseccomp

    read = {node.attr for node in ast.walk(ast.parse(inspect.getsource(oseccomp.build_filter)))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "spec"}
    keyed = {node.attr for node in ast.walk(ast.parse(inspect.getsource(oseccomp._key)))
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "spec"}
    assert read and read <= keyed, read - keyed


def test_a_signal_while_the_supervisor_answers_does_not_fail_the_syscall() -> None:
    """CI saw fakeroot's "Cannot fork": dash's SIGCHLD handler (no SA_RESTART) ran while the
    supervisor answered its fork, and the fork failed with EINTR. The filter is loaded with
    WAIT_KILLABLE_RECV: a signal after the supervisor took the syscall waits for the answer.
    Here: the child's getppid is notified, the parent takes it, signals the child, waits, and
    only then answers CONTINUE; the syscall must succeed and the handler must have run."""
    need("seccomp.notify")
    if not probe().seccomp_wait_killable:
        pytest.skip(probe().seccomp_wait_killable_reason)
    import pyseccomp

    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    f.add_rule(pyseccomp.NOTIFY, "getppid")
    program = oseccomp.export_program(f)
    nr_getppid = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "getppid")
    ready_r, ready_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: confine, hand the fd number over, make the notified call
        try:
            handled = []
            signal.signal(signal.SIGUSR1, lambda *_: handled.append(1))  # CPython: no SA_RESTART
            ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            fd, degraded = oseccomp.load_program(program, listener=True)
            os.write(ready_w, f"{fd}".encode())
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            rc = libc.syscall(ctypes.c_long(nr_getppid))
            err = ctypes.get_errno() if rc < 0 else 0
            os.write(out_w, json.dumps({"rc": rc, "errno": err, "degraded": degraded,
                                        "handled": len(handled)}).encode())
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(out_w)
    result = None
    try:
        listener = oseccomp.take_listener(pid, int(os.read(ready_r, 32)))
        notif = oseccomp.Notif()
        fcntl.ioctl(listener, oseccomp.SECCOMP_IOCTL_NOTIF_RECV, notif)
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.2)  # the handler would run now and the call return EINTR without the flag
        resp = oseccomp.NotifResp(notif.id, 0, 0, oseccomp.SECCOMP_USER_NOTIF_FLAG_CONTINUE)
        try:
            fcntl.ioctl(listener, oseccomp.SECCOMP_IOCTL_NOTIF_SEND, resp)
        except FileNotFoundError:
            withdrawn = json.loads(os.read(out_r, 4096))
            pytest.fail(f"the signal withdrew the pending notification: the call failed, {withdrawn}")
        result = json.loads(os.read(out_r, 4096))
    finally:
        if result is None:  # a step above failed: the child may wait on its call forever
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(out_r)
    assert result["degraded"] == ""
    assert result["errno"] == 0 and result["rc"] == os.getpid(), result
    assert result["handled"] == 1, result  # the signal was delivered, after the answer

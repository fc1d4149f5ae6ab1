"""Watch one sandboxed run: merge the audit-hook event stream with seccomp
notifications, answer notifications, enforce the timeout and the process
limit, and kill every process the sandbox left behind.

One thread, one ``selectors`` loop over three sources: the event FIFO, the
seccomp listener, and a pidfd of the sandbox's first process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import selectors
import signal
import socket
import time
from typing import Dict, Optional, Tuple

from pipguard import notify, rules
from pipguard.launcher import Started
from pipguard.plan import HOOK_DIR, Plan
from pipguard.evidence import Collector, Evidence
from pipguard.lifetime import Lifetime
from pipguard.responders import NativeResponder
from pipguard.report import ALLOWED, BLOCKED, ProcessRecord

_AT_FDCWD = -100
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_MSG_FASTOPEN = 0x20000000
_HANDLED = -1  # a handler already answered the notification itself
# AUDIT_ARCH_* of this interpreter's native ABI (linux/audit.h); x32 marks its numbers with bit 30.
# Unknown machines learn it from the first notification (the launcher's own execve).
_NATIVE_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7, "riscv64": 0xC00000F3,
                "ppc64le": 0xC0000015, "s390x": 0x80000016}.get(platform.machine())
_X32_BIT = 0x40000000 if platform.machine() == "x86_64" else 1 << 62
_FAIL_CLOSED = frozenset(("connect", "bind", "sendto", "sendmsg", "sendmmsg", "socket",
                          "open", "openat", "openat2", "creat"))
_NSCD_SOCKET_TYPE = socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
_SCAN_INTERVAL = 0.05
_CPU_POLL = 0.25  # seconds between reads of the cgroup's CPU time, when a CPU limit is set
_HOOK_CACHE = os.path.join(HOOK_DIR, "__pycache__") + "/"

_RESOLVE_IN_ROOT = 0x10  # linux/openat2.h


_DEV_STDIO = {"/dev/stdin": "0", "/dev/stdout": "1", "/dev/stderr": "2"}


def _normalised(path: str) -> bool:
    """No "..", ".", or empty component that could make a prefix test lie."""
    return "/.." not in path and "//" not in path and "/./" not in path and not path.endswith("/.")


@contextlib.contextmanager
def _signals_deferred(on_signal):
    """Hold back the signals that would raise KeyboardInterrupt (Ctrl-C, and
    SIGTERM under the CLI) while the sandbox is killed and its evidence
    closed: a second one must not cut that short and leave processes running.
    One that arrived meanwhile is consumed and passed to ``on_signal``; the
    run already ends as interrupted. Only the main thread gets signals, so
    elsewhere this does nothing."""
    import threading

    held = {s for s in (signal.SIGINT, signal.SIGTERM)
            if signal.getsignal(s) is signal.default_int_handler}
    if not held or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        while held & signal.sigpending():
            signal.sigwait(held & signal.sigpending())
            on_signal()
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _syscall_names() -> Dict[int, str]:
    try:
        import pyseccomp

        names = {}
        for nr in range(0, 460):
            try:
                raw = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, nr)
            except Exception:
                continue
            if raw:
                names[nr] = raw.decode() if isinstance(raw, bytes) else str(raw)
        return names
    except Exception:
        return {}




def _deny_errno() -> Dict[str, int]:
    try:
        from pipguard.oslayer.seccomp import DENY_ERRNO

        return dict(DENY_ERRNO)
    except Exception:
        return {}


class Supervisor:
    def __init__(self, plan: Plan, started: Started, cgroup=None) -> None:
        # Names of the notified syscalls come from the child that built the
        # filter; libseccomp is only loaded here as a fallback.
        self._names = dict(started.syscalls) or _syscall_names()
        self.plan = plan
        #: the run's bounds (timeout, event cap, limits): the plan's, never the Policy's
        self.settings = plan.settings
        self.started = started
        self.root_pid = started.process.pid
        # the evidence collector, which the proxy and the ns decoy watch feed too
        self.collector = Collector(plan.settings.max_events)
        self.evidence = self.collector.evidence
        self.add_event = self.collector.add_event
        self.add_network = self.collector.add_network
        # who belongs to the run, and killing what it leaves behind
        self.lifetime = Lifetime(plan, started, self.collector, cgroup)
        self.memory = notify.Memory()
        #: the run's cgroup (pipguard.limits.RunCgroup) or None
        self.cgroup = cgroup
        self._native_arch: Optional[int] = _NATIVE_ARCH
        self.deny_errno = _deny_errno()
        self._t0 = time.time()
        self._fifo_buf = b""
        self.notifications = 0  # answered by Python
        self._forks_since_scan = 0
        self._live_at_scan = 1
        self._last_scan = 0.0
        self._root_exec_seen = False
        # Every file decision comes from the one rule table (pipguard/rules.py),
        # and so do the native responder's prefix tables.
        from pipguard.plan import SYSTEM_READ

        self._grants = rules.Grants.of(plan.homes, plan.home_dir, plan.read_roots, plan.write_roots,
                                       [plan.fifo], plan.private_roots, plan.toolchain_prefixes)
        tables = rules.native_tables(self._grants, SYSTEM_READ)
        self._fixed_fast = tuple(tables["fixed_fast"])
        self._read_fast = tuple(tables["read_fast"])
        self._write_fast = tuple(tables["write_fast"])
        self._never_fast = tuple(tables["never_fast"])
        self._network = plan.settings.network
        self.proxy_clients: Dict[int, int] = {}  # our local port -> sandbox pid
        self._dns = self.collector.dns  # address -> host name, from lookups seen in the run
        self._fifo_fd: Optional[int] = None
        self._responder: Optional[NativeResponder] = None

    def _read_fifo(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            return
        self._fifo_buf += data
        *lines, self._fifo_buf = self._fifo_buf.split(b"\n")
        if len(self._fifo_buf) > 1 << 16:  # a writer that never ends a line
            self._fifo_buf = b""
            self.evidence.dropped += 1
        for line in lines:
            self._audit_event(line)

    def _audit_event(self, line: bytes) -> None:
        try:
            raw = json.loads(line)
            kind, action = str(raw["kind"]), str(raw["action"])
            pid, target, rule = int(raw["pid"]), str(raw["target"]), str(raw["rule"])
        except (ValueError, KeyError, TypeError):
            self.evidence.dropped += 1  # malformed: the sandbox writes this channel too
            return
        if action == "hint" and rule == "dns-result":
            for address in (raw.get("detail") or {}).get("addresses", [])[:32]:
                if len(self._dns) < 4096:
                    self._dns[str(address)] = target
            return
        if action not in (ALLOWED, BLOCKED):
            self.evidence.dropped += 1
            return
        detail = dict(raw.get("detail") or {})
        if raw.get("python"):
            detail["python"] = str(raw["python"])
        if raw.get("ppid"):
            detail["ppid"] = raw["ppid"]
        self.add_event(kind, action, "audit", pid, target, rule, detail,
                       when=float(raw.get("time") or time.time()))
        if kind == "network" and detail.get("address") in self._dns:
            detail.setdefault("host", self._dns[str(detail["address"])])
        if kind == "network" and detail.get("op") in ("connect", "sendto", "sendmsg", "bind"):
            self.add_network(str(detail.get("family", "")), str(detail.get("protocol", "")),
                              str(detail.get("address", "")), detail.get("port"), None,
                              action, pid, "audit")
        elif kind == "network" and detail.get("protocol") == "dns":
            self.add_network("dns", "dns", "", None, target, action, pid, "audit")

    # --------------------------------------------------------- notifications
    def _handle_notification(self, listener: int) -> None:
        note = notify.receive(listener)
        if note is not None:
            self._dispatch(listener, note)

    def _read_forwarded(self, responder: NativeResponder, listener: int) -> bool:
        """Answer what the native responder forwarded. False once it has ended."""
        notes = responder.forwarded()
        for note in notes or ():
            self._dispatch(listener, note)
        return notes is not None

    def _start_responder(self, listener: int) -> Optional[NativeResponder]:
        """The native responder for ``listener`` (pipguard/responders.py), or None:
        answer everything from Python."""
        return NativeResponder.start(
            listener, arch=self._native_arch, names=self._names, write_mask=_WRITE_FLAGS,
            tables={"fixed_fast": self._fixed_fast, "read_fast": self._read_fast,
                    "write_fast": self._write_fast, "never_fast": self._never_fast})

    def _stop_responder(self, responder: NativeResponder, listener: int) -> None:
        self.evidence.supervision.update(responder.stop())
        try:  # what it forwarded before it stopped still needs an answer
            while self._read_forwarded(responder, listener) and responder.pending():
                pass
        except OSError:
            pass
        responder.close()

    def _dispatch(self, listener: int, note: notify.Notification) -> None:
        self.notifications += 1
        if self._native_arch is None:
            self._native_arch = note.arch
        if note.arch != self._native_arch or note.nr >= _X32_BIT:
            # int 0x80 / x32: a foreign ABI, never legitimate in the sandbox
            # (ENOSYS, as if the kernel lacked it); numbers are not ours to name.
            self.add_event("syscall", BLOCKED, "seccomp", note.pid,
                           f"foreign-ABI syscall {note.nr & ~_X32_BIT} (arch {note.arch:#x})",
                           "foreign-abi", {"arch": hex(note.arch), "nr": note.nr})
            notify.respond_error(listener, note.id, errno.ENOSYS)
            return
        name = self._names.get(note.nr, f"syscall_{note.nr}")
        handler = getattr(self, "_on_" + name, None)
        try:
            if handler is not None:
                err = handler(note)
            else:
                err = self._on_denied(note, name)
        except Exception as exc:  # never leave a syscall hanging on a supervisor bug
            # Fail closed where we guard something; exec/exit/fork only observe.
            err = errno.EPERM if name in _FAIL_CLOSED else None
            self.add_event("syscall", BLOCKED if err else ALLOWED, "supervisor", note.pid, name,
                           "supervisor-error", {"error": repr(exc)})
        if err == _HANDLED:
            return
        if err:
            notify.respond_error(listener, note.id, err)
        else:
            notify.respond_continue(listener, note.id)

    def _on_denied(self, note: notify.Notification, name: str) -> int:
        err = self.deny_errno.get(name, errno.EPERM)
        self.add_event("syscall", BLOCKED, "seccomp", note.pid, name, "syscall-denied",
                       {"syscall": name, "errno": errno.errorcode.get(err, str(err)),
                        "args": [hex(a) for a in note.args[:3]]})
        return err

    def _on_socket(self, note: notify.Notification) -> int:
        family, stype = note.args[0], note.args[1] & 0xF
        names = {1: "unix", 2: "inet", 10: "inet6", 16: "netlink", 17: "packet"}
        fam = names.get(family, f"af{family}")
        proto = {1: "stream", 2: "dgram", 3: "raw", 5: "seqpacket", 10: "packet"}.get(stype, str(stype))
        target = f"socket({fam}, {proto})"
        rule = "socket-denied"
        if family == 1 and note.args[1] == _NSCD_SOCKET_TYPE and note.args[2] == 0:
            # glibc's nscd client (nscd_helper.c open_socket) on every getpwuid/getgrgid
            # of `ls -l`, `id`, bash without $SHELL...: still refused and listed, but
            # tagged so it is not mistaken for an attempt to reach ssh-agent/docker.sock.
            rule = "nscd-probe"
        self.add_event("network", BLOCKED, "seccomp", note.pid, target, rule,
                       {"syscall": "socket", "family": fam, "type": proto})
        self.add_network(fam, proto, "", None, None, BLOCKED, note.pid, "seccomp")
        return self.deny_errno.get("socket", errno.EPERM)

    def _on_socketpair(self, note: notify.Notification) -> int:
        return self._on_socket(note)

    def _record_exec(self, note: notify.Notification, path: str, argv_addr: int) -> None:
        argv = tuple(self.memory.string_array(note.pid, argv_addr)) or (path,)
        self.memory.forget(note.pid)
        ppid, _comm = notify.proc_stat(note.pid)
        if note.pid == self.root_pid and not self._root_exec_seen:
            self._root_exec_seen = True  # the launcher's own exec of the command
            self.evidence.processes[note.pid] = ProcessRecord(note.pid, os.getpid(), argv)
            return
        # One record per pid: a re-exec (shell `exec`, pyenv shims) updates the
        # argv; every exec is still an event of its own.
        if note.pid not in self.evidence.processes:
            self.evidence.process_order.append(note.pid)
        else:
            ppid = self.evidence.processes[note.pid].ppid or ppid
        if len(self.evidence.processes) > self.settings.max_events:
            self.evidence.dropped += 1
            return
        self.evidence.processes[note.pid] = ProcessRecord(note.pid, ppid, argv)
        self.add_event("process", ALLOWED, "supervisor", note.pid, " ".join(argv)[:1000], "exec",
                       {"argv": list(argv[:64]), "path": path, "ppid": ppid})

    def _on_execve(self, note: notify.Notification) -> int:
        path = self.memory.string(note.pid, note.args[0])
        self._record_exec(note, path, note.args[1])
        return 0

    def _on_execveat(self, note: notify.Notification) -> int:
        path = self.memory.string(note.pid, note.args[1])
        self._record_exec(note, path, note.args[2])
        return 0

    def _on_exit_group(self, note: notify.Notification) -> int:
        record = self.evidence.processes.get(note.pid)
        if record is not None:
            self.evidence.processes[note.pid] = ProcessRecord(
                record.pid, record.ppid, record.argv, note.args[0] & 0xFF)
        self.memory.forget(note.pid)
        return 0

    def _process_limit(self, note: notify.Notification) -> int:
        now = time.monotonic()
        if now - self._last_scan > _SCAN_INTERVAL:
            self._live_at_scan = len(self.lifetime.descendants())
            self._forks_since_scan = 0
            self._last_scan = now
        self._forks_since_scan += 1
        if self._live_at_scan + self._forks_since_scan > self.settings.processes:
            first = self.evidence.limit_hit is None
            self.evidence.limit_hit = self.evidence.limit_hit or "processes"
            self.add_event("process", BLOCKED, "supervisor", note.pid, "fork", "limit-processes",
                           {"limit": self.settings.processes}, always=first)
            return errno.EAGAIN
        return 0

    _on_fork = _on_vfork = _on_clone = _process_limit

    # signals ---------------------------------------------------------------
    # Landlock's signal scope refuses signals that leave the sandbox, silently.
    # These handlers only add the evidence: EPERM (what Landlock answers) plus
    # an event when the target is outside, CONTINUE otherwise. The decision
    # uses register arguments only, and Landlock still enforces either way.
    @staticmethod
    def _int(value: int) -> int:
        value &= 0xFFFFFFFF
        return value - (1 << 32) if value >= 1 << 31 else value

    @staticmethod
    def _tgid(tid: int) -> int:
        try:
            with open(f"/proc/{tid}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Tgid:"):
                        return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return tid

    def _signal_decision(self, note: notify.Notification, op: str, pid: int, sig: int) -> int:
        if self.lifetime.own_pid_namespace:
            return 0  # its pids are not ours to compare, and it can name nothing outside
        if pid == 0:
            return 0  # our own process group: the sandbox has its own session
        if pid > 0 and (pid == note.pid or self._tgid(pid) == self._tgid(note.pid)):
            return 0  # to itself (raise(), abort(), Go's preemption tgkill): no /proc scan
        inside = self.lifetime.descendants()
        if pid < -1:
            groups = set()
            for member in inside:
                try:
                    with open(f"/proc/{member}/stat", "rb") as fh:
                        data = fh.read()
                    groups.add(int(data[data.rfind(b")") + 2:].split()[2]))
                except (OSError, ValueError, IndexError):
                    continue
            if -pid in groups:
                return 0
        elif pid > 0 and self._tgid(pid) in inside:
            return 0
        target = "every process" if pid == -1 else (f"pid {pid}" if pid > 0 else f"process group {-pid}")
        _ppid, comm = notify.proc_stat(abs(pid)) if pid != -1 else (0, "")
        self.add_event("signal", BLOCKED, "supervisor", note.pid, target, "signal-outside",
                       {"syscall": op, "signal": sig, "comm": comm})
        return errno.EPERM

    def _on_kill(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "kill", self._int(note.args[0]), self._int(note.args[1]))

    def _on_tkill(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "tkill", self._int(note.args[0]), self._int(note.args[1]))

    def _on_tgkill(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "tgkill", self._int(note.args[0]), self._int(note.args[2]))

    def _on_rt_sigqueueinfo(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "rt_sigqueueinfo", self._int(note.args[0]),
                                     self._int(note.args[1]))

    def _on_rt_tgsigqueueinfo(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "rt_tgsigqueueinfo", self._int(note.args[0]),
                                     self._int(note.args[2]))

    def _on_pidfd_send_signal(self, note: notify.Notification) -> int:
        # The pidfd's target is in the sender's fdinfo; if we misread it
        # (fd table raced), Landlock still decides.
        pid = 0
        try:
            with open(f"/proc/{note.pid}/fdinfo/{self._int(note.args[0])}", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Pid:"):
                        pid = int(line.split()[1])
        except (OSError, ValueError):
            return 0
        if pid <= 0:
            return 0
        return self._signal_decision(note, "pidfd_send_signal", pid, self._int(note.args[1]))

    # network ---------------------------------------------------------------
    def _socket_protocol(self, pid: int, fd: int) -> str:
        try:
            dup = notify.take_fd(pid, fd)
        except OSError:
            return "?"
        try:
            s = socket.socket(fileno=dup)
            try:
                stype = s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
            finally:
                s.detach()
            return {1: "tcp", 2: "udp", 3: "raw", 5: "seqpacket"}.get(stype, str(stype))
        except OSError:
            return "?"
        finally:
            os.close(dup)

    def _network_decision(self, note: notify.Notification, op: str, addr: int, size: int,
                          fd: int) -> int:
        raw = self.memory.read(note.pid, addr, max(0, min(int(size), 128)))
        family, address, port = notify.decode_sockaddr(raw)
        if self._fifo_fd is not None:
            self._read_fifo(self._fifo_fd)  # a DNS answer written just before this connect
        if family == "unix" and self._network == "all":
            return 0  # only socketpair() sockets exist in the sandbox: nothing leaves
        protocol = self._socket_protocol(note.pid, fd) if op in ("connect", "bind") else "udp"
        if port == 53:
            protocol = "dns"
        target = f"[{address}]:{port}" if family == "inet6" else f"{address}:{port}"
        detail = {"syscall": op, "family": family, "protocol": protocol, "address": address,
                  "port": port}
        if address in self._dns:
            detail["host"] = self._dns[address]
        # "none" refuses whatever the memory said, and "hosts" never lets the
        # kernel act on the sandbox's sockaddr: the decision must not depend
        # on bytes another thread can change after we read them.
        if (self._network == "hosts" and op == "connect" and family == "inet"
                and address == "127.0.0.1" and port == self.plan.proxy_port and protocol == "tcp"):
            return self._connect_on_behalf(note, fd, target, detail)
        allowed = self._network == "all"
        action = ALLOWED if allowed else BLOCKED
        rule = "network-allowed" if allowed else "network-denied"
        if op == "bind" and not allowed and address in ("127.0.0.1", "::1", "0.0.0.0", "::"):
            rule = "loopback-bind"  # e.g. urllib3's IPv6 probe: informational
        self.add_event("network", action, "supervisor", note.pid, target, rule, detail)
        self.add_network(family, protocol, address, port, None, action, note.pid, "supervisor")
        return 0 if allowed else errno.EACCES

    def _connect_on_behalf(self, note: notify.Notification, fd: int, target: str, detail: dict) -> int:
        """Connect a socket of our own to the index proxy and put it in place
        of the sandbox's fd (ADDFD+SETFD): the kernel never connects the
        sandbox's socket, so a sockaddr swapped after our read changes nothing."""
        listener, proxy_port = self.started.listener, self.plan.proxy_port
        assert listener is not None and proxy_port is not None  # answering its notification
        flags = notify.fd_flags(note.pid, fd)
        ours = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
        try:
            ours.setblocking(not flags & os.O_NONBLOCK)
            self.proxy_clients[ours.getsockname()[1]] = note.pid
            notify.install_fd(listener, note.id, ours.fileno(), fd,
                              bool(flags & os.O_CLOEXEC))
        finally:
            ours.close()
        self.add_event("network", ALLOWED, "supervisor", note.pid, target, "index-proxy", detail)
        notify.respond_value(listener, note.id, 0)
        return _HANDLED

    def _on_connect(self, note: notify.Notification) -> int:
        return self._network_decision(note, "connect", note.args[1], note.args[2], note.args[0])

    def _on_bind(self, note: notify.Notification) -> int:
        return self._network_decision(note, "bind", note.args[1], note.args[2], note.args[0])

    def _fastopen(self, note: notify.Notification, flags: int, op: str) -> int:
        # TCP Fast Open connects inside sendto/sendmsg. The flag is a register
        # argument, so refusing it involves no pointer and no race.
        if self._network == "all" or not flags & _MSG_FASTOPEN:
            return 0
        self.add_event("network", BLOCKED, "supervisor", note.pid, f"{op}(MSG_FASTOPEN)",
                       "network-denied", {"syscall": op})
        return errno.EACCES

    def _on_sendto(self, note: notify.Notification) -> int:
        if self._fastopen(note, note.args[3], "sendto"):
            return errno.EACCES
        if not note.args[4]:
            return 0
        return self._network_decision(note, "sendto", note.args[4], note.args[5], note.args[0])

    def _msghdr_name(self, pid: int, addr: int) -> Tuple[int, int]:
        raw = self.memory.read(pid, addr, 16)
        if len(raw) < 16:
            return 0, 0
        import struct

        ptr, size = struct.unpack("=QI", raw[:12])
        return ptr, size

    def _on_sendmsg(self, note: notify.Notification) -> int:
        if self._fastopen(note, note.args[2], "sendmsg"):
            return errno.EACCES
        ptr, size = self._msghdr_name(note.pid, note.args[1])
        if not ptr:
            return 0
        return self._network_decision(note, "sendmsg", ptr, size, note.args[0])

    def _on_sendmmsg(self, note: notify.Notification) -> int:
        if self._fastopen(note, note.args[3], "sendmmsg"):
            return errno.EACCES
        for i in range(min(int(note.args[2]), 64)):
            ptr, size = self._msghdr_name(note.pid, note.args[1] + 64 * i)
            if ptr:
                err = self._network_decision(note, "sendmmsg", ptr, size, note.args[0])
                if err:
                    return err
        return 0

    # files -----------------------------------------------------------------
    def _resolve(self, pid: int, dirfd: int, path: str) -> str:
        if path.startswith("/proc/self/") or path == "/proc/self":
            path = f"/proc/{pid}" + path[len("/proc/self"):]
        elif path.startswith("/proc/thread-self"):
            path = f"/proc/{pid}" + path[len("/proc/thread-self"):]
        elif path.startswith("/dev/fd/") or path in _DEV_STDIO:
            # /dev/fd is a link to /proc/self/fd: resolved here it would be
            # pipguard's own fds (bash's process substitution opens /dev/fd/63)
            path = f"/proc/{pid}/fd/" + (path[len("/dev/fd/"):] if path.startswith("/dev/fd/")
                                         else _DEV_STDIO[path])
        if not path.startswith("/"):
            if dirfd == _AT_FDCWD:
                base_link = f"/proc/{pid}/cwd"
            else:
                base_link = f"/proc/{pid}/fd/{dirfd}"
            try:
                base = os.readlink(base_link)
            except OSError:
                base = "/"
            path = base.rstrip("/") + "/" + path
        return os.path.realpath(path)

    def _inside(self, pid: int):
        """Is a /proc/<n> entry one of the sandbox's own processes (as seen by ``pid``)?"""
        return lambda other: other == pid or other in self.evidence.processes

    def _file_decision(self, note: notify.Notification, dirfd: int, path_addr: int,
                       flags: int, in_root: bool = False) -> int:
        raw = self.memory.string(note.pid, path_addr)
        if not raw:
            return 0
        if in_root:  # openat2 RESOLVE_IN_ROOT: "/" means dirfd
            raw = raw.lstrip("/") or "."
        writing = bool(flags & _WRITE_FLAGS)
        # Fast path (the hot one: every open of a build): a read of a normalised
        # absolute path under a root the sandbox cannot write (so no symlink
        # of its own making on the way) needs no realpath. Everything else is
        # resolved: Landlock grants all of /proc, so "proc-other-process" and
        # the decoy HOME's rules are enforced here. (The native responder does
        # the same, and resolves the rest itself; see pipguard/_responder.c.)
        if not writing and raw.startswith(self._fixed_fast) and _normalised(raw) \
                and not raw.startswith(self._never_fast):
            return 0
        path = self._resolve(note.pid, dirfd, raw)
        detail = {"syscall": "open", "path": raw, "flags": hex(flags)}
        inside = self._inside(note.pid)
        if writing:
            if path.startswith("/proc/") and not rules.proc_other(path, inside):
                return 0  # its own /proc (fd links to pipes: realpath cannot see through them); Landlock decides
            rule = rules.write_rule(path, self._grants, inside)
            if rule is None:
                return 0
            if rule == "write-outside-roots" and path.startswith(_HOOK_CACHE):
                # An interpreter of another version caching pipguard's own hook
                # (plan.precompile_hook covers only pipguard's interpreter): refused
                # like any write outside the roots, but it says nothing about the package.
                rule = "hook-bytecode"
            self.add_event("file-write", BLOCKED, "supervisor", note.pid, path, rule, detail)
            return errno.EACCES
        rule = rules.read_rule(path, self._grants, inside)
        if rule in ("home-read", "foreign-read") and not os.path.lexists(path):
            # Only existing files: interpreters probe for absent files in
            # their prefix (pyvenv.cfg...) and that reveals nothing.
            rule = None
        if rule is None:
            return 0
        if rule == "config-lookup":
            self.add_event("file-read", ALLOWED, "supervisor", note.pid, path, rule, detail)
            return 0
        self.add_event("file-read", BLOCKED, "supervisor", note.pid, path, rule, detail)
        return errno.EACCES

    def _on_open(self, note: notify.Notification) -> int:
        return self._file_decision(note, _AT_FDCWD, note.args[0], note.args[1])

    def _on_creat(self, note: notify.Notification) -> int:
        return self._file_decision(note, _AT_FDCWD, note.args[0], os.O_CREAT | os.O_WRONLY)

    def _on_openat(self, note: notify.Notification) -> int:
        dirfd = note.args[0] & 0xFFFFFFFF
        dirfd = dirfd - (1 << 32) if dirfd >= 1 << 31 else dirfd
        return self._file_decision(note, dirfd, note.args[1], note.args[2])

    def _on_openat2(self, note: notify.Notification) -> int:
        import struct

        # struct open_how { u64 flags; u64 mode; u64 resolve; }
        raw = self.memory.read(note.pid, note.args[2], 24)
        flags, _mode, resolve = struct.unpack("=QQQ", raw) if len(raw) == 24 else (0, 0, 0)
        dirfd = note.args[0] & 0xFFFFFFFF
        dirfd = dirfd - (1 << 32) if dirfd >= 1 << 31 else dirfd
        return self._file_decision(note, dirfd, note.args[1], flags,
                                   in_root=bool(resolve & _RESOLVE_IN_ROOT))

    # ------------------------------------------------------------------- loop
    def run(self) -> Evidence:
        fifo = os.open(self.plan.fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._fifo_fd = fifo
        keepalive = os.open(self.plan.fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        pidfd = self.started.process.pidfd
        keeper = self.started.process.keeper_sock.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fifo, selectors.EVENT_READ, "fifo")
        listener = self.started.listener
        responder = None
        if listener is not None:
            self.evidence.supervision.update(responder="python", answered_natively=0,
                                             sync_wake_up=notify.sync_wake_up(listener))
            responder = self._start_responder(listener)
            self._responder = responder
            if responder is not None:
                sel.register(responder.forward_fd, selectors.EVENT_READ, "forwarded")
            else:
                sel.register(listener, selectors.EVENT_READ, "notify")
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        sel.register(keeper, selectors.EVENT_READ, "keeper")
        deadline = None if self.settings.timeout is None else time.monotonic() + self.settings.timeout
        try:
            try:
                self._watch(sel, listener, fifo, pidfd, deadline)
            except KeyboardInterrupt:
                # Ctrl-C (or SIGTERM, made alike by the CLI) wherever the loop was,
                # not only while it waited: the kill below must run either way.
                self.evidence.interrupted = "interrupted"
            # The first process is gone (or time is up, or we were interrupted):
            # nothing of the sandbox may outlive it. Keep answering notifications
            # while we kill, so no process hangs in a notified syscall; a second
            # signal waits until that is done.
            with _signals_deferred(self._interrupted):
                self.lifetime.kill_all(lambda: self._answer_while_killing(sel, listener, fifo))
        finally:
            with _signals_deferred(self._interrupted):
                self._close(responder, listener, fifo, keepalive, pidfd, sel)
        self.evidence.exit_code = self.started.process.wait()
        self.started.process.release()
        self.lifetime.limit_events()
        return self.evidence

    def _close(self, responder, listener, fifo, keepalive, pidfd, sel) -> None:
        """Stop the native responder, collect the last events, release everything."""
        if responder is not None and listener is not None:
            self._stop_responder(responder, listener)
        if listener is not None:
            self.evidence.supervision["answered_by_python"] = self.notifications
            os.close(listener)
        if self.proxy_clients:
            # every connection made for the sandbox, not one per destination as the events
            # are: the VM backend traces each relayed request to its guest pid by it
            self.evidence.supervision["proxy_clients"] = {str(p): pid for p, pid in self.proxy_clients.items()}
        self._read_fifo(fifo)
        os.close(keepalive)
        self._drain(fifo)
        os.close(fifo)
        self._fifo_fd = None
        self.memory.close()
        sel.close()

    def _interrupted(self) -> None:
        self.evidence.interrupted = self.evidence.interrupted or "interrupted"

    def _serve_forwarded(self, fd: int, sel, listener: int) -> None:
        """Answer what the native responder forwarded; once it has ended, listen
        ourselves. It ends normally when no sandboxed task is left (the listener
        hung up; the exit event is on its way); on an error, join() reports it."""
        try:
            alive = self._responder is not None and self._read_forwarded(self._responder, listener)
        except OSError:
            alive = False
        if not alive:
            sel.unregister(fd)
            sel.register(listener, selectors.EVENT_READ, "notify")

    def _watch(self, sel, listener, fifo, pidfd, deadline) -> None:
        """Answer and record until the sandbox's first process exits, time
        is up or a limit is hit."""
        process = self.started.process
        poll_cpu = self.cgroup is not None and self.cgroup.limits_cpu
        while process.returncode is None:
            wait = 0.2 if pidfd is None else None
            if poll_cpu:
                wait = _CPU_POLL if wait is None else min(wait, _CPU_POLL)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.evidence.timed_out = True
                    break
                wait = left if wait is None else min(wait, left)
            ready = sel.select(wait)
            for key, _mask in ready:
                if key.data == "fifo":
                    self._read_fifo(fifo)
                elif key.data == "notify" and listener is not None:
                    try:
                        self._handle_notification(listener)
                    except OSError:
                        sel.unregister(listener)
                elif key.data == "forwarded" and listener is not None:
                    self._serve_forwarded(key.fd, sel, listener)
                elif key.data == "keeper":
                    if not process.read_reports(block=False):
                        sel.unregister(key.fd)  # the keeper is gone: nothing left to wait for
                        return
                elif key.data == "exit":
                    # exited; its status follows from the keeper, which reaps it
                    sel.unregister(key.fd)
                    pidfd = None
            if poll_cpu and self.lifetime.cpu_exceeded():
                return

    def _answer_while_killing(self, sel, listener, fifo) -> None:
        """One short round of the loop while lifetime kills: no process may
        hang in a notified syscall, and the last events still arrive."""
        process = self.started.process
        for key, _mask in sel.select(0.01):
            if key.data == "notify":
                try:
                    self._handle_notification(listener)
                except OSError:
                    pass
            elif key.data == "forwarded":
                self._serve_forwarded(key.fd, sel, listener)
            elif key.data == "fifo":
                self._read_fifo(fifo)
            elif key.data == "keeper":
                if not process.read_reports(block=False):
                    sel.unregister(key.fd)

    def _drain(self, fifo: int) -> None:
        while True:
            try:
                data = os.read(fifo, 1 << 16)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            self._fifo_buf += data
            *lines, self._fifo_buf = self._fifo_buf.split(b"\n")
            for line in lines:
                self._audit_event(line)

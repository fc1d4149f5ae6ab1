"""What each notified syscall is, and the decision for it.

The seccomp filter sends some syscalls to the supervisor (pipguard/sandbox/oslayer/
seccomp.py says which); for each one the supervisor's loop finds its
``on_<syscall>`` method with :meth:`Handlers.handler`, or calls
:meth:`Handlers.denied` for one the filter denies outright. A handler reads
the syscall's arguments (registers, and the caller's memory where it must),
records what it saw with the evidence collector and returns the answer: 0
(let the kernel run it), an errno (refuse it), or :data:`HANDLED` (it
answered itself).

- **files** (open, openat, openat2, creat): the one rule table
  (pipguard/rules.py) on the resolved path; the native responder's fast
  tables come from the same grants (:attr:`Handlers.fast_tables`);
- **network** (socket, socketpair, connect, bind, sendto, sendmsg, sendmmsg):
  the plan's network mode; under ``hosts`` a connect to the index proxy is made by
  pipguard on the sandbox's behalf;
- **signals** (kill, tkill, tgkill, rt_(tg)sigqueueinfo, pidfd_send_signal):
  evidence for what Landlock's signal scope refuses;
- **processes** (execve, execveat, exit_group, fork, vfork, clone): the
  process records and the process limit.

Handlers read the plan and its settings, never the user's request.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Callable, Dict, Optional, Tuple

from pipguard.sandbox import notify
from pipguard import rules
from pipguard.sandbox.evidence import Collector
from pipguard.sandbox.lifetime import Lifetime
from pipguard.sandbox.oslayer.seccomp import CLONE_NAMESPACES
from pipguard.sandbox.pathview import AT_FDCWD, PathView
from pipguard.sandbox.plan import HOOK_DIR, Plan
from pipguard.report.model import ALLOWED, BLOCKED, ProcessRecord

#: the open flags that make an open a write (the native responder gets the same mask)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
HANDLED = -1  # a handler already answered the notification itself
_O_TMPFILE = getattr(os, "O_TMPFILE", 0o20200000)
_MSG_FASTOPEN = 0x20000000
_NSCD_SOCKET_TYPE = socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
_SCAN_INTERVAL = 0.05
_HOOK_CACHE = os.path.join(HOOK_DIR, "__pycache__") + "/"
_RESOLVE_IN_ROOT = 0x10  # linux/openat2.h


def _normalised(path: str) -> bool:
    """No "..", ".", or empty component that could make a prefix test lie."""
    return "/.." not in path and "//" not in path and "/./" not in path and not path.endswith("/.")


def _deny_errno() -> Dict[str, int]:
    try:
        from pipguard.sandbox.oslayer.seccomp import DENY_ERRNO

        return dict(DENY_ERRNO)
    except Exception:
        return {}


def _int(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _tgid(tid: int) -> int:
    try:
        with open(f"/proc/{tid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tid


class Handlers:
    """The decisions of one run. ``listener``: the seccomp listener (a
    connect on the sandbox's behalf installs its fd through it);
    ``catch_up``: reads the audit events already written (a DNS answer just
    before a connect names its host)."""

    def __init__(self, plan: Plan, listener: Optional[int], collector: Collector,
                 lifetime: Lifetime, catch_up: Callable[[], None]) -> None:
        self.settings = plan.settings
        self.evidence = collector.evidence
        self._collector = collector
        self._dns = collector.dns  # address -> host name, from lookups seen in the run
        self._lifetime = lifetime
        self.command_pid = lifetime.command_pid
        self._listener = listener
        self._catch_up = catch_up
        #: reads the sandbox's memory (/proc/PID/mem) for pointer arguments
        self.memory = notify.Memory()
        self.deny_errno = _deny_errno()
        self._forks_since_scan = 0
        self._live_at_scan = 1
        self._last_scan = 0.0
        self._root_exec_seen = False
        # Every file decision comes from the one rule table (pipguard/rules.py),
        # and so do the native responder's prefix tables.
        self._grants = rules.Grants.of(plan.homes, plan.home_dir, plan.read_roots, plan.write_roots,
                                       [plan.fifo], plan.private_roots, plan.toolchain_prefixes,
                                       plan.namespace_tmpfs)
        #: the write roots that are bound from the host (same path inside and out)
        self._host_write = tuple(r for r in self._grants.write if r not in self._grants.namespace_own)
        #: where the paths its processes name lead (the host's view, and the namespace's own)
        self._paths = PathView(self._grants.namespace_own, lifetime)
        tables = rules.native_tables(self._grants, rules.SYSTEM_READ)
        #: the prefixes the native responder answers itself (fixed_fast, read_fast, write_fast, never_fast)
        self.fast_tables = {name: tuple(tables[name])
                            for name in ("fixed_fast", "read_fast", "write_fast", "never_fast")}
        self._fixed_fast = self.fast_tables["fixed_fast"]
        self._never_fast = self.fast_tables["never_fast"]
        self._network = plan.settings.network
        self._proxy_port = plan.proxy_port
        self.proxy_clients: Dict[int, int] = {}  # our local port -> sandbox pid

    # A notification names the thread that made the call (the kernel's tid): a resolver or
    # worker thread's attempt is the process's, recorded under its pid (its tgid), or the
    # report showed a pid no process record names.
    def _process_of(self, tid: int) -> int:
        return tid if tid in self.evidence.processes else _tgid(tid)

    def add_event(self, kind: str, action: str, layer: str, pid: int, *rest, **kw) -> None:
        self._collector.add_event(kind, action, layer, self._process_of(pid), *rest, **kw)

    def add_network(self, family: str, protocol: str, address: str, port: Optional[int],
                    host: Optional[str], action: str, pid: int, layer: str) -> None:
        self._collector.add_network(family, protocol, address, port, host, action,
                                    self._process_of(pid), layer)

    def handler(self, name: str) -> Optional[Callable[[notify.Notification], int]]:
        """The handler of the notified syscall ``name``; None: the filter
        denies it (answer with :meth:`denied`)."""
        return getattr(self, "on_" + name, None)

    def close(self) -> None:
        self.memory.close()

    def denied(self, note: notify.Notification, name: str) -> int:
        """A syscall the filter denies (notified so that it is reported): its
        errno from the seccomp layer's table, EPERM when it has none."""
        err = self.deny_errno.get(name, errno.EPERM)
        self.add_event("syscall", BLOCKED, "seccomp", note.pid, name, "syscall-denied",
                       {"syscall": name, "errno": errno.errorcode.get(err, str(err)),
                        "args": [hex(a) for a in note.args[:3]]})
        return err

    # processes -------------------------------------------------------------
    def _record_exec(self, note: notify.Notification, path: str, argv_addr: int) -> None:
        argv = tuple(self.memory.string_array(note.pid, argv_addr)) or (path,)
        self.memory.forget(note.pid)
        pid = self._process_of(note.pid)  # a thread's exec: the process takes its pid's place
        ppid, _comm = notify.proc_stat(pid)
        if pid == self.command_pid and not self._root_exec_seen:
            self._root_exec_seen = True  # the launcher's own exec of the command
            record = self.evidence.processes.get(pid)
            self.evidence.processes[pid] = ProcessRecord(pid, record.ppid if record else ppid, argv)
            return
        # One record per pid: a re-exec (shell `exec`, pyenv shims) updates the
        # argv; every exec is still an event of its own.
        if pid not in self.evidence.processes:
            self.evidence.process_order.append(pid)
        else:
            ppid = self.evidence.processes[pid].ppid or ppid
        if len(self.evidence.processes) > self.settings.max_events:
            self.evidence.dropped += 1
            return
        self.evidence.processes[pid] = ProcessRecord(pid, ppid, argv)
        self.add_event("process", ALLOWED, "supervisor", pid, " ".join(argv)[:1000], "exec",
                       {"argv": list(argv[:64]), "path": path, "ppid": ppid})

    def on_execve(self, note: notify.Notification) -> int:
        path = self.memory.string(note.pid, note.args[0])
        self._record_exec(note, path, note.args[1])
        return 0

    def on_execveat(self, note: notify.Notification) -> int:
        path = self.memory.string(note.pid, note.args[1])
        self._record_exec(note, path, note.args[2])
        return 0

    def on_exit_group(self, note: notify.Notification) -> int:
        record = self.evidence.processes.get(self._process_of(note.pid))
        if record is not None:
            self.evidence.processes[note.pid] = ProcessRecord(
                record.pid, record.ppid, record.argv, note.args[0] & 0xFF)
        self.memory.forget(note.pid)
        return 0

    def _process_limit(self, note: notify.Notification) -> int:
        now = time.monotonic()
        if now - self._last_scan > _SCAN_INTERVAL:
            self._live_at_scan = len(self._lifetime.descendants())
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

    on_fork = on_vfork = _process_limit

    def on_clone(self, note: notify.Notification) -> int:
        if any(note.args[0] & flag for flag in CLONE_NAMESPACES):
            # a namespace of its own, as unshare would make (denied always): with a user
            # namespace a build gets chroot, and its paths mean something else (4th review)
            return self.denied(note, "clone")
        return self._process_limit(note)

    # signals ---------------------------------------------------------------
    # Landlock's signal scope refuses signals that leave the sandbox, silently.
    # These handlers only add the evidence: EPERM (what Landlock answers) plus
    # an event when the target is outside, CONTINUE otherwise. The decision
    # uses register arguments only, and Landlock still enforces either way.
    def _signal_decision(self, note: notify.Notification, op: str, pid: int, sig: int) -> int:
        if self._lifetime.own_pid_namespace:
            return 0  # its pids are not ours to compare, and it can name nothing outside
        if pid == 0:
            return 0  # our own process group: the sandbox has its own session
        if pid > 0 and (pid == note.pid or _tgid(pid) == _tgid(note.pid)):
            return 0  # to itself (raise(), abort(), Go's preemption tgkill): no /proc scan
        inside = self._lifetime.descendants()
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
        elif pid > 0 and _tgid(pid) in inside:
            return 0
        target = "every process" if pid == -1 else (f"pid {pid}" if pid > 0 else f"process group {-pid}")
        _ppid, comm = notify.proc_stat(abs(pid)) if pid != -1 else (0, "")
        self.add_event("signal", BLOCKED, "supervisor", note.pid, target, "signal-outside",
                       {"syscall": op, "signal": sig, "comm": comm})
        return errno.EPERM

    def on_kill(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "kill", _int(note.args[0]), _int(note.args[1]))

    def on_tkill(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "tkill", _int(note.args[0]), _int(note.args[1]))

    def on_tgkill(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "tgkill", _int(note.args[0]), _int(note.args[2]))

    def on_rt_sigqueueinfo(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "rt_sigqueueinfo", _int(note.args[0]),
                                     _int(note.args[1]))

    def on_rt_tgsigqueueinfo(self, note: notify.Notification) -> int:
        return self._signal_decision(note, "rt_tgsigqueueinfo", _int(note.args[0]),
                                     _int(note.args[2]))

    def on_pidfd_send_signal(self, note: notify.Notification) -> int:
        # The pidfd's target is in the sender's fdinfo; if we misread it
        # (fd table raced), Landlock still decides.
        pid = 0
        try:
            with open(f"/proc/{note.pid}/fdinfo/{_int(note.args[0])}", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Pid:"):
                        pid = int(line.split()[1])
        except (OSError, ValueError):
            return 0
        if pid <= 0:
            return 0
        return self._signal_decision(note, "pidfd_send_signal", pid, _int(note.args[1]))

    # network ---------------------------------------------------------------
    def on_socket(self, note: notify.Notification) -> int:
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
        if rule not in rules.INFO_RULES:  # an informational refusal is an event only (one answer)
            self.add_network(fam, proto, "", None, None, BLOCKED, note.pid, "seccomp")
        return self.deny_errno.get("socket", errno.EPERM)

    def on_socketpair(self, note: notify.Notification) -> int:
        return self.on_socket(note)

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
        self._catch_up()  # a DNS answer written just before this connect
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
                and address == "127.0.0.1" and port == self._proxy_port and protocol == "tcp"):
            return self._connect_on_behalf(note, fd, target, detail)
        allowed = self._network == "all"
        action = ALLOWED if allowed else BLOCKED
        rule = "network-allowed" if allowed else "network-denied"
        if op == "bind" and not allowed and address in ("127.0.0.1", "::1", "0.0.0.0", "::"):
            rule = "loopback-bind"  # e.g. urllib3's IPv6 probe: informational
        self.add_event("network", action, "supervisor", note.pid, target, rule, detail)
        if rule not in rules.INFO_RULES:  # the report's network table would call it "blocked"
            self.add_network(family, protocol, address, port, None, action, note.pid, "supervisor")
        return 0 if allowed else errno.EACCES

    def _connect_on_behalf(self, note: notify.Notification, fd: int, target: str, detail: dict) -> int:
        """Connect a socket of our own to the index proxy and put it in place
        of the sandbox's fd (ADDFD+SETFD): the kernel never connects the
        sandbox's socket, so a sockaddr swapped after our read changes nothing."""
        listener, proxy_port = self._listener, self._proxy_port
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
        return HANDLED

    def on_connect(self, note: notify.Notification) -> int:
        return self._network_decision(note, "connect", note.args[1], note.args[2], note.args[0])

    def on_bind(self, note: notify.Notification) -> int:
        return self._network_decision(note, "bind", note.args[1], note.args[2], note.args[0])

    def _fastopen(self, note: notify.Notification, flags: int, op: str) -> int:
        # TCP Fast Open connects inside sendto/sendmsg. The flag is a register
        # argument, so refusing it involves no pointer and no race.
        if self._network == "all" or not flags & _MSG_FASTOPEN:
            return 0
        self.add_event("network", BLOCKED, "supervisor", note.pid, f"{op}(MSG_FASTOPEN)",
                       "network-denied", {"syscall": op})
        return errno.EACCES

    def on_sendto(self, note: notify.Notification) -> int:
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

    def on_sendmsg(self, note: notify.Notification) -> int:
        if self._fastopen(note, note.args[2], "sendmsg"):
            return errno.EACCES
        ptr, size = self._msghdr_name(note.pid, note.args[1])
        if not ptr:
            return 0
        return self._network_decision(note, "sendmsg", ptr, size, note.args[0])

    def on_sendmmsg(self, note: notify.Notification) -> int:
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
    def _still_waiting(self, note: notify.Notification) -> bool:
        """Does the notifying thread still wait for this answer? Not once it (or its
        process) has exited or exec'd: what pipguard could not see of it then is no
        finding (its /proc files were already gone or root's)."""
        return self._listener is None or notify.id_valid(self._listener, note.id)

    def _inside(self, pid: int):
        """Is a /proc/<n> entry one of the sandbox's own processes (as seen by ``pid``)?
        In a pid namespace of its own, always: its /proc is that namespace's, where
        every number names one of its processes (pid 1, pipguard's init, is not
        dumpable: the kernel refuses its private files) — the number is not a host
        pid to look up (that looked-up host process made ``ps`` under ns with read
        observation a ``proc-other-process`` finding)."""
        if self._lifetime.own_pid_namespace:
            return lambda other: True
        return lambda other: other == pid or other in self.evidence.processes

    def _hidden(self, note: notify.Notification, writing: bool, target: str, detail: dict) -> int:
        """An open whose target pipguard cannot know (unreadable memory, a name it
        may not resolve): refused and reported as hidden, never let through unseen."""
        self.add_event("file-write" if writing else "file-read", BLOCKED, "supervisor", note.pid, target,
                       "unreadable-arguments", detail)
        return errno.EACCES

    def _file_decision(self, note: notify.Notification, dirfd: int, path_addr: int,
                       flags: int, mode: int = 0, in_root: bool = False) -> int:
        raw = self.memory.string(note.pid, path_addr)
        if not raw:
            # only memory closed to pipguard counts, not a process that exited or exec'd
            # meanwhile, nor a bad pointer (the kernel's EFAULT): second review
            if path_addr and self.memory.closed(note.pid) and self._still_waiting(note):
                # (and it still waits: an exiting process's /proc files are root's, which
                # looked closed to a normal user for the last notifications of its threads)
                # its memory cannot be read: a process that made itself non-dumpable
                # (prctl) when pipguard is not root. Its path is unknown, so the open
                # counts as hidden: refused and reported, never let through unseen
                return self._hidden(note, bool(flags & WRITE_FLAGS), f"(unreadable: pid {note.pid})",
                                    {"syscall": "open", "flags": hex(flags)})
            return 0
        if in_root:  # openat2 RESOLVE_IN_ROOT: "/" means dirfd
            raw = raw.lstrip("/") or "."
        writing = bool(flags & WRITE_FLAGS)
        if (flags & os.O_CREAT or flags & _O_TMPFILE == _O_TMPFILE) and mode & rules.PRIVILEGED_MODES:
            # the open(O_CREAT, 04755) way to what chmod is refused: as root under ns the new
            # file would be a setuid-root program on the host while the run lasts (the native
            # responder forwards these; the mode is a register argument: no TOCTOU)
            path = self._paths.resolve(note.pid, dirfd, raw) or raw
            self.add_event("file-write", BLOCKED, "supervisor", note.pid, path, "privileged-mode",
                           {"syscall": "open", "path": raw, "flags": hex(flags), "mode": f"{mode & 0o7777:o}"})
            return errno.EPERM
        # Fast path (the hot one: every open of a build): a read of a normalised
        # absolute path under a root the sandbox cannot write (so no symlink
        # of its own making on the way) needs no realpath. Everything else is
        # resolved: Landlock grants all of /proc, so "proc-other-process" and
        # the decoy HOME's rules are enforced here. (The native responder does
        # the same, and resolves the rest itself; see pipguard/sandbox/_responder.c.)
        if not writing and raw.startswith(self._fixed_fast) and _normalised(raw) \
                and not raw.startswith(self._never_fast):
            return 0
        seen = self._paths.in_namespace(note.pid, dirfd, raw) if writing else None
        detail = {"syscall": "open", "path": raw, "flags": hex(flags)}
        if seen and seen[1] == "denied":
            if (seen[0].startswith("/proc/") or rules.under(seen[0], self._grants.namespace_own)) \
                    and not rules.under(seen[0], self._host_write) and self._still_waiting(note):
                # a directory of its /tmp that pipguard (not root) may not search: where the
                # write leads is unknown, so it counts as hidden (second review)
                return self._hidden(note, True, seen[0], dict(
                    detail, ns="not resolvable in its world (a directory pipguard may not search, "
                               "another process's /proc entry)"))
            seen = None  # elsewhere the host's view is the sandbox's: decide on it
        resolved = seen[0] if seen else self._paths.resolve(note.pid, dirfd, raw)
        if resolved is None:
            # its base directory's name cannot be read (longer than PATH_MAX): unknown
            return self._hidden(note, writing, raw, dict(detail, why="its directory's name cannot be read"))
        path = resolved
        if writing and seen is None and self._grants.namespace_own and rules.under(
                path, self._grants.namespace_own) and not rules.under(path, self._host_write) \
                and self._still_waiting(note):
            # Under ns, not resolved in its world (through its /proc by another name, from a
            # removed directory, a loop): on the host the path lands in /tmp, which in its
            # world is its own — or whatever a link there points to. Unknown: hidden (third review)
            return self._hidden(note, True, path, dict(detail, ns="not resolvable in the sandbox's world"))
        inside = self._inside(note.pid)
        if writing:
            if path.startswith("/proc/") and not rules.proc_other(path, inside):
                return 0  # its own /proc (fd links to pipes: realpath cannot see through them); Landlock decides
            if seen and seen[1] == "missing" and rules.under(path, self._grants.namespace_own) \
                    and not rules.under(path, self._host_write):
                # no such directory in its world: the kernel says ENOENT. Where the host has
                # it, the write was aimed at the host's (another project's tree): a finding
                parent = os.path.dirname(path)
                if parent not in self._grants.namespace_own and os.path.isdir(parent):
                    self.add_event("file-write", BLOCKED, "ns", note.pid, path, "write-outside-roots",
                                   dict(detail, ns="a host directory that is not in the sandbox's world"))
                return errno.ENOENT
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

    def on_open(self, note: notify.Notification) -> int:
        return self._file_decision(note, AT_FDCWD, note.args[0], note.args[1], note.args[2])

    def on_creat(self, note: notify.Notification) -> int:
        return self._file_decision(note, AT_FDCWD, note.args[0], os.O_CREAT | os.O_WRONLY, note.args[1])

    def on_openat(self, note: notify.Notification) -> int:
        dirfd = note.args[0] & 0xFFFFFFFF
        dirfd = dirfd - (1 << 32) if dirfd >= 1 << 31 else dirfd
        return self._file_decision(note, dirfd, note.args[1], note.args[2], note.args[3])

    def on_openat2(self, note: notify.Notification) -> int:
        import struct

        # struct open_how { u64 flags; u64 mode; u64 resolve; }
        raw = self.memory.read(note.pid, note.args[2], 24)
        # (in memory, unlike open's and openat's registers: a second thread could change the
        # mode after this read; the after-run sweep of ns as root is the backstop there)
        flags, mode, resolve = struct.unpack("=QQQ", raw) if len(raw) == 24 else (0, 0, 0)
        dirfd = note.args[0] & 0xFFFFFFFF
        dirfd = dirfd - (1 << 32) if dirfd >= 1 << 31 else dirfd
        return self._file_decision(note, dirfd, note.args[1], flags, mode,
                                   in_root=bool(resolve & _RESOLVE_IN_ROOT))

"""Watch one sandboxed run: the loop that merges the audit-hook event stream
with seccomp notifications, answers each notification, and ends the run when
its first process exits, time is up or a limit is hit.

One thread, one ``selectors`` loop over its sources: the event FIFO, the
seccomp listener (or the native responder's forwarded notifications,
pipguard/sandbox/responders.py), the keeper's reports and a pidfd of the sandbox's
first process. What each notified syscall means and the answer to it are
the handlers' (pipguard/sandbox/handlers.py); who belongs to the run and killing
what it leaves behind are the lifetime's (pipguard/sandbox/lifetime.py); what all of
them see goes to the evidence collector (pipguard/sandbox/evidence.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import selectors
import signal
import time
from typing import Any, Callable, Dict, Optional, Sequence

from pipguard.sandbox import notify
from pipguard.sandbox.launcher import Started
from pipguard.sandbox.plan import Plan
from pipguard.sandbox.evidence import Collector, Evidence
from pipguard.sandbox.handlers import HANDLED, WRITE_FLAGS, Handlers
from pipguard.sandbox.lifetime import Lifetime
from pipguard.sandbox.responders import NativeResponder
from pipguard.report.model import ALLOWED, BLOCKED

# AUDIT_ARCH_* of this interpreter's native ABI (linux/audit.h); x32 marks its numbers with bit 30.
# Unknown machines learn it from the first notification (the launcher's own execve).
_NATIVE_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7, "riscv64": 0xC00000F3,
                "ppc64le": 0xC0000015, "s390x": 0x80000016}.get(platform.machine())
_X32_BIT = 0x40000000 if platform.machine() == "x86_64" else 1 << 62
_FAIL_CLOSED = frozenset(("connect", "bind", "sendto", "sendmsg", "sendmmsg", "socket",
                          "open", "openat", "openat2", "creat"))
_CPU_POLL = 0.25  # seconds between reads of the cgroup's CPU time, when a CPU limit is set
#: seconds without a notification or an event after which the caller's idle work gets a step
_QUIET = 0.02


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


class Supervisor:
    def __init__(self, plan: Plan, started: Started, cgroup=None, readers: Sequence[Any] = (),
                 idle: Optional[Callable[[], bool]] = None) -> None:
        # Names of the notified syscalls come from the child that built the
        # filter; libseccomp is only loaded here as a fallback.
        self._names = dict(started.syscalls) or _syscall_names()
        self.plan = plan
        #: the run's bounds (timeout, event cap, limits): the plan's, never the Policy's
        self.settings = plan.settings
        self.started = started
        # the evidence collector, which the proxy and the ns decoy watch feed too
        self.collector = Collector(plan.settings.max_events)
        self.evidence = self.collector.evidence
        self.add_event = self.collector.add_event
        self.add_network = self.collector.add_network
        # who belongs to the run, and killing what it leaves behind
        self.lifetime = Lifetime(plan, started, self.collector, cgroup)
        # the decision for each notified syscall
        self.handlers = Handlers(plan, started.listener, self.collector, self.lifetime,
                                 catch_up=self._catch_up)
        #: our local port -> sandbox pid, of each connection made to the proxy for the sandbox
        self.proxy_clients = self.handlers.proxy_clients
        #: the run's cgroup (pipguard.sandbox.limits.RunCgroup) or None
        self.cgroup = cgroup
        #: other evidence sources the loop reads when they are readable: each has
        #: ``fileno()`` and ``read()`` (which takes in all that is queued), as the
        #: ns backend's decoy watch does
        self.readers = tuple(readers)
        #: the caller's work for when the run is quiet (one step per call, False: none left),
        #: e.g. the clean-up of its previous run (pipguard.sandbox.rundir.on_idle)
        self.idle = idle
        self._native_arch: Optional[int] = _NATIVE_ARCH
        self._fifo_buf = b""
        self.notifications = 0  # answered by Python
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

    def _catch_up(self) -> None:
        """Read what the audit hook already wrote (while the FIFO is open)."""
        if self._fifo_fd is not None:
            self._read_fifo(self._fifo_fd)

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
    def _handle_notification(self, listener: int) -> bool:
        """Answer one notification; False once the listener hung up (no task is left that
        could send one: stop watching it)."""
        note = notify.receive(listener)
        if note is not None:
            self._dispatch(listener, note)
            return True
        return not notify.hung_up(listener)

    def _read_forwarded(self, responder: NativeResponder, listener: int) -> bool:
        """Answer what the native responder forwarded. False once it has ended."""
        notes = responder.forwarded()
        for note in notes or ():
            self._dispatch(listener, note)
        return notes is not None

    def _start_responder(self, listener: int) -> Optional[NativeResponder]:
        """The native responder for ``listener`` (pipguard/sandbox/responders.py), or None:
        answer everything from Python."""
        return NativeResponder.start(
            listener, arch=self._native_arch, names=self._names, write_mask=WRITE_FLAGS,
            tables=self.handlers.fast_tables)

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
        handler = self.handlers.handler(name)
        err: Optional[int]
        try:
            if handler is not None:
                err = handler(note)
            else:
                err = self.handlers.denied(note, name)
        except Exception as exc:  # never leave a syscall hanging on a supervisor bug
            # Fail closed where we guard something; exec/exit/fork only observe.
            err = errno.EPERM if name in _FAIL_CLOSED else None
            self.add_event("syscall", BLOCKED if err else ALLOWED, "supervisor", note.pid, name,
                           "supervisor-error", {"error": repr(exc)})
        if err == HANDLED:
            return
        if err:
            notify.respond_error(listener, note.id, err)
        else:
            notify.respond_continue(listener, note.id)

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
        for reader in self.readers:
            sel.register(reader.fileno(), selectors.EVENT_READ, reader)
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
        self.handlers.close()
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
        next_cpu_read = time.monotonic() + _CPU_POLL
        idle = self.idle
        while process.returncode is None:
            wait = 0.2 if pidfd is None else None
            if poll_cpu:
                wait = _CPU_POLL if wait is None else min(wait, _CPU_POLL)
            if idle is not None:
                wait = _QUIET if wait is None else min(wait, _QUIET)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.evidence.timed_out = True
                    break
                wait = left if wait is None else min(wait, left)
            ready = sel.select(wait)
            if not ready and idle is not None and not idle():
                idle = None  # nothing left: wait for the run alone again
            for key, _mask in ready:
                if key.data == "fifo":
                    self._read_fifo(fifo)
                elif key.data == "notify" and listener is not None:
                    try:
                        if not self._handle_notification(listener):
                            sel.unregister(listener)
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
                elif key.data in self.readers:
                    key.data.read()
            # every _CPU_POLL, not after every notification: a build's burst of opens
            # and execs made this read of cpu.stat ~1 per loop turn (~5 ms a hook call)
            if poll_cpu and time.monotonic() >= next_cpu_read:
                next_cpu_read = time.monotonic() + _CPU_POLL
                if self.lifetime.cpu_exceeded():
                    return

    def _answer_while_killing(self, sel, listener, fifo) -> None:
        """One short round of the loop while lifetime kills: no process may
        hang in a notified syscall, and the last events still arrive."""
        process = self.started.process
        for key, _mask in sel.select(0.01):
            if key.data == "notify":
                try:
                    if not self._handle_notification(listener):
                        sel.unregister(listener)
                except OSError:
                    sel.unregister(listener)
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

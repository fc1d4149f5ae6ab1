"""The VM backend's host side of one run (:func:`run`): the checks before a boot
(:func:`preflight`, :func:`_check_guest_code`), the plan, the guest's configuration written
for its init (mounts, environment, the inner policy), the host's proxy and its relay
(``_Network``), the boot itself with the timeout and the report read back
(:func:`_boot`), and the host proxy's records merged with the guest's events
(:func:`_merge_proxy`). Why the backend is built this way: :mod:`pipguard.sandbox.vm`.

Imports this package's ``tools``, ``shares``, ``qemu`` and ``relay``, the errors, the backend
interface's ``Probe``, and (when called) the plan, the proxy, the files' snapshots, the host
summary and the report model.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pipguard.errors import LayerUnavailable, PipguardError
from pipguard.sandbox.backends import Probe
from pipguard.sandbox.vm.qemu import MACHINE, console_tail, kvm_status, qemu_argv
from pipguard.sandbox.vm.relay import END
from pipguard.sandbox.vm.shares import Share, settle_mapped, shares_of, stage_etc, system_layout
from pipguard.sandbox.vm.tools import NAME, NINEP, Tools, find_tools, initramfs

#: the report port's content is read up to this size (the guest is untrusted)
REPORT_LIMIT = 64 << 20
#: the guest's end of the channel to the host's proxy (the init names ports /dev/pg.NAME)
NET_DEVICE = "/dev/pg.net"


# -- one run -----------------------------------------------------------------

def _memory_mb(policy) -> int:
    if policy.limit_memory:
        return max(256, policy.limit_memory >> 20)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    except (ValueError, OSError):
        total = 2048
    return max(256, min(2048, total // 2))


def _output_path(fd: int, run_dir: str, name: str) -> Tuple[str, bool]:
    """Where QEMU writes a guest stream: this process's own fd ``fd``
    reopened through /proc when it is a terminal or a pipe we may reopen
    (the output streams), else a file copied to ``fd`` at the end (True): a regular file
    reopened would have its own offset, and this process's later writes to
    ``fd`` would overwrite the guest's."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return os.devnull, False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        try:
            # QEMU runs as this user: it can reopen the pipe only if we can (a pipe
            # another user made and handed to us, e.g. root's to nobody's, is mode 0600)
            os.close(os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC))
            return f"/proc/{os.getpid()}/fd/{fd}", False
        except OSError:
            pass  # then copied at the end, not streamed
    return os.path.join(run_dir, name), True


def _read_guest_message(path: str) -> Optional[Dict[str, Any]]:
    """The guest's report, if it arrived whole (None otherwise)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(REPORT_LIMIT + 1)
    except OSError:
        return None
    if len(data) > REPORT_LIMIT or not data.endswith(END):
        return None
    try:
        message = json.loads(data[: -len(END)].decode("utf-8"))
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def preflight(accel: str) -> Tools:
    """The tools of a boot under ``accel``, or :class:`LayerUnavailable`
    with the reason (exit 2 at the CLI, before anything ran): install and
    sandbox call it before pip starts."""
    tools, parts = find_tools()
    if tools is None:
        raise LayerUnavailable("the VM backend is unavailable: " + Probe(NAME, parts).reason,
                               hint="pipguard doctor lists what is missing")
    if accel == "kvm":
        ok, reason = kvm_status(tools)
        if not ok:
            raise LayerUnavailable(f"KVM does not work here: {reason}",
                                   hint="add --vm-accel tcg to run under software emulation (slow), "
                                        "or use --isolation auto")
    return tools


def _check_guest_code() -> None:
    """The guest runs this interpreter and this pipguard from read-only shares
    that QEMU reads as this process's uid. Refused here, before a boot, when
    that uid cannot: ``pkgbuild``'s worker (switched from root to the build
    user) with pipguard or its interpreter under a 0700 home (``/root``)."""
    import pipguard

    for what, path in (("interpreter", sys.executable), ("package", os.path.dirname(pipguard.__file__))):
        if not os.access(path, os.R_OK | os.X_OK):
            raise LayerUnavailable(
                f"the VM's guest could not start pipguard: uid {os.getuid()}, which runs QEMU, cannot "
                f"read pipguard's {what} {path}",
                hint="install pipguard (and its interpreter) where that user can read them, e.g. a "
                     "virtual environment outside a private home")


def run(argv: Sequence[str], policy, *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
        record_build_dir: bool = False, progress=None, unsafe_guest_prelude: Optional[str] = None):
    """Run ``argv`` in a VM under ``policy`` (``policy.isolation == "vm"``)
    and return the :class:`~pipguard.report.model.Report`.

    Raises :class:`~pipguard.errors.LayerUnavailable` before anything runs
    when qemu, a kernel or a static busybox is missing, when
    ``policy.vm_accel`` is ``"kvm"`` and KVM does not work here, or when the
    policy asks for the whole network (``allow_hosts`` is served: see the
    module's docstring). ``unsafe_guest_prelude``
    is shell code the guest's init runs as guest root before pipguard starts
    (tests use it to crash the guest kernel); never take it from a user.
    """
    from pipguard.sandbox.plan import make_plan
    from pipguard.sandbox.rundir import cleanup

    notify = progress or (lambda message: None)
    if policy.allow_network:
        raise LayerUnavailable("the VM backend gives no full network: --allow-network cannot be used "
                               "with --isolation vm",
                               hint="name the hosts the build needs (--allow-host / --allow-build-host): "
                                    "the guest reaches them through pipguard's filtering proxy")
    tools = preflight(policy.vm_accel)
    _check_guest_code()
    accel = policy.vm_accel
    argv = [os.fspath(a) for a in argv]
    source_env = dict(os.environ if env is None else env)
    proxy = _start_proxy(policy.allow_hosts)
    try:
        # the host's plan names the host's proxy (the guest's pipguard plans its own relay)
        plan = make_plan(argv, policy, cwd=cwd, env=source_env, proxy_port=proxy.port if proxy else None)
        try:
            return _run_planned(plan, policy, tools, accel, source_env, record_build_dir, notify,
                                unsafe_guest_prelude, proxy)
        finally:
            cleanup(plan.run_dir)
    finally:
        if proxy is not None:
            proxy.__exit__(None, None, None)


def _run_planned(plan, policy, tools: Tools, accel: str, source_env: Mapping[str, str],
                 record_build_dir: bool, notify, prelude: Optional[str], proxy):
    from pipguard.sandbox.plan import etc_entries
    from pipguard.sandbox.plan import scrub_env

    started_at = time.time()
    run_dir = plan.run_dir
    private = (plan.tmp_dir, plan.home_dir)
    write_roots = [r for r in plan.write_roots if r not in private]
    system_dirs, links = system_layout()
    read_roots = [*system_dirs, *plan.read_roots]
    shares = shares_of(read_roots, write_roots)
    guest_dir = os.path.join(run_dir, "guest")
    os.mkdir(guest_dir, 0o700)
    stage_etc(os.path.join(run_dir, "etc"), etc_entries())

    # What the guest's init reads (mounts.sh is generated: every path quoted)
    q = shlex.quote
    # the kernel's built-in initramfs part makes /root mode 0700; in the guest it holds only
    # mount points (a pyenv interpreter in /root/.pyenv), which a non-root guest user must reach
    mounts = ["$BB mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp", "$BB chmod 0755 /root"]
    for link, target in links:
        mounts.append(f"$BB ln -s {q(target)} {q(link)}")
    tagged = [(f"s{i}", share) for i, share in enumerate(shares)]
    for tag, share in tagged:
        # read-only on the host (readonly=on: the boundary), not in the guest: a guest-side ro
        # mount answers access(W_OK) with EROFS where the host answers from the file's mode
        # (makepkg's [[ -w $SRCDEST ]] on the build phase's read-only sources); the guest's
        # Landlock refuses, and reports, the sandbox's writes there as on the host
        mode = "rw,cache=mmap" if share.writable else "cache=loose"
        mounts.append(f"$BB mkdir -p {q(share.path)} && "
                      f"$BB mount -t 9p -o {NINEP},{mode} {tag} {q(share.path)}")
    mounts += ["$BB mkdir -p /etc && $BB mount -t 9p -o " + NINEP + ",ro,cache=loose pgetc /etc",
               "$BB mkdir -p /dev/shm && $BB mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm"]
    with open(os.path.join(guest_dir, "mounts.sh"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(mounts) + "\n")
    with open(os.path.join(guest_dir, "env.sh"), "w", encoding="utf-8") as fh:
        fh.write(f"PG_CWD={q(plan.cwd)}\nPG_PYTHON={q(sys.executable)}\n"
                 f"PG_PORTS={q(' '.join(['report', 'stdout', 'stderr'] + ['net'] * bool(proxy)))}\n"
                 f"PG_UID={os.getuid()}\nPG_GID={os.getgid()}\n")
    if prelude:
        with open(os.path.join(guest_dir, "prelude.sh"), "w", encoding="utf-8") as fh:
            fh.write(prelude + "\n")
    kept, _removed = scrub_env(source_env, policy.keep_env)
    # the guest is the boundary: inside it, the plain layers on the guest's own filesystem
    inner = dict(policy.to_json(), isolation="auto", prefer_ns=False, timeout=None, vm_accel="kvm")
    with open(os.path.join(guest_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump({"argv": list(plan.argv), "cwd": plan.cwd, "env": kept, "policy": inner,
                   "uid": os.getuid(), "gid": os.getgid(),
                   "net_device": NET_DEVICE if proxy else None}, fh)

    console = os.path.join(run_dir, "console.log")
    report_port = os.path.join(run_dir, "report.out")
    stdout, copy_out = _output_path(1, run_dir, "stdout.out")
    stderr, copy_err = _output_path(2, run_dir, "stderr.out")
    network = _Network.start(proxy, os.path.join(run_dir, "net.sock")) if proxy else None
    try:
        argv = qemu_argv(
            tools, initramfs(tools), accel, console=console, memory_mb=_memory_mb(policy),
            ports=(("report", report_port), ("stdout", stdout), ("stderr", stderr)),
            shares=[*tagged, ("pgcfg", Share(guest_dir, False)),
                    ("pgetc", Share(os.path.join(run_dir, "etc"), False))],
            net_socket=network.relay.path if network else None)
        return _boot(plan, policy, tools, accel, argv, shares, network, record_build_dir,
                     write_roots, notify, started_at, console, report_port,
                     ((copy_out, stdout, 1), (copy_err, stderr, 2)))
    finally:
        if network is not None:
            network.stop()


def _start_proxy(hosts):
    """The host's filtering proxy for the plan's hosts, serving (None: no hosts)."""
    if not hosts:
        return None
    from pipguard.sandbox.proxy import Destination, IndexProxy

    return IndexProxy(tuple(Destination(h.host, h.port) for h in hosts)).__enter__()


@dataclass(frozen=True)
class _Network:
    """A run's only network: the host's filtering proxy for the plan's
    hosts (stopped by :func:`run`), and the relay QEMU's ``net`` port connects to."""

    proxy: Any  # pipguard.sandbox.proxy.IndexProxy
    relay: Any  # pipguard.sandbox.vm.relay.HostRelay

    @classmethod
    def start(cls, proxy, socket_path: str) -> "_Network":
        from pipguard.sandbox.vm.relay import HostRelay

        return cls(proxy, HostRelay(socket_path, proxy.port).start())

    def stop(self) -> None:
        self.relay.stop()


#: at most this many relay streams are read from the guest's report (the guest is untrusted)
MAX_GUEST_STREAMS = 4096


def _guest_pids(guest, message: Optional[Mapping[str, Any]], relay) -> Dict[int, int]:
    """Host proxy client port -> the guest pid whose connection carried it:
    the host relay's stream ids (stream -> its connection's port at the
    proxy), the guest's ``relay_streams`` (stream -> the guest-side port of
    the connection the guest's supervisor made for the sandbox) and that
    supervisor's ``supervision.proxy_clients`` (that port -> pid). Guest
    data, so a guest whose kernel was taken over can misattribute (never
    add or hide) a request."""
    raw = message.get("relay_streams") if message else None
    clients = guest.supervision.get("proxy_clients") if guest is not None else None
    if not isinstance(raw, dict) or not isinstance(clients, dict):
        return {}
    out: Dict[int, int] = {}
    for conn_id, guest_port in list(raw.items())[:MAX_GUEST_STREAMS]:
        host_port = relay.streams.get(int(conn_id)) if str(conn_id).isdigit() else None
        pid = clients.get(str(guest_port)) if isinstance(guest_port, int) else None
        if host_port is not None and isinstance(pid, int) and pid > 0:
            out[host_port] = pid
    return out


def _merge_proxy(guest, network: Optional[_Network], max_events: int,
                 message: Optional[Mapping[str, Any]] = None):
    """The guest's events and destinations with the host proxy's records
    added, as ``run`` adds its proxy's (one event per destination and
    outcome), each with the guest pid whose connection carried the request
    (:func:`_guest_pids`; 0 and ``detail.pid`` saying why when it cannot be
    traced). Returns (events renumbered by time, network attempts, events dropped)."""
    from pipguard.report.model import Event, NetworkAttempt

    events = list(guest.events) if guest else []
    attempts = list(guest.network) if guest else []
    dropped = guest.events_dropped if guest else 0
    if network is None:
        return tuple(events), tuple(attempts), dropped
    pids = _guest_pids(guest, message, network.relay)
    seen = set()
    for when, action, host, port, how, client in list(network.proxy.records):
        protocol = "https" if how == "CONNECT" else "http"
        target = f"{host}:{port}"
        if (target, action) in seen:
            continue
        if len(events) >= max_events:
            dropped += 1
            continue
        seen.add((target, action))
        rule = "index-allowed" if action == "allowed" else "not-an-index"
        pid = pids.get(client, 0)
        events.append(Event(0, when, "network", action, "proxy", pid, target, rule,
                            {"protocol": protocol, "method": how, "host": host, "port": port,
                             "seen": "the host's proxy, through the VM's relay",
                             "pid": ("in the guest: the process whose connection the guest's supervisor "
                                     "made" if pid else "unknown: in the guest, not traced to a process")}))
        attempt = NetworkAttempt("inet", protocol, host, port, host, action, pid, "proxy")
        if attempt not in attempts:
            attempts.append(attempt)
    ordered = sorted(events, key=lambda e: (e.time, e.seq))
    renumbered = tuple(Event(i + 1, e.time, e.kind, e.action, e.layer, e.pid, e.target, e.rule, e.detail)
                       for i, e in enumerate(ordered))
    return renumbered, tuple(attempts), dropped


def _boot(plan, policy, tools: Tools, accel: str, qemu_argv: List[str], shares: Sequence[Share],
          network: Optional["_Network"], record_build_dir: bool, write_roots: Sequence[str], notify,
          started_at: float, console: str, report_port: str, copies):
    from pipguard import __version__
    from pipguard.sandbox import files
    from pipguard.report.model import LayerStatus, Report
    from pipguard.report.model import from_json as report_from_json
    from pipguard.sandbox.host import summary as host_summary

    run_dir = plan.run_dir

    roots = [r for r in write_roots if record_build_dir or r != plan.cwd]
    before = files.snapshot(roots)
    notify(f"booting a {accel} VM for {' '.join(plan.argv)[:80]}")
    deadline = None if policy.timeout is None else time.monotonic() + policy.timeout
    timed_out = interrupted = False
    with open(os.path.join(run_dir, "qemu.err"), "wb") as err:
        proc = subprocess.Popen(qemu_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
    try:
        try:
            proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    for copy, path, fd in copies:
        if copy and os.path.exists(path):
            with open(path, "rb") as fh, os.fdopen(os.dup(fd), "wb") as out:
                shutil.copyfileobj(fh, out)

    for share in shares:
        if share.writable:
            settle_mapped(share.path)
    written = files.changed(before, files.snapshot(roots))
    tail = console_tail(console)
    with open(os.path.join(run_dir, "qemu.err"), "rb") as fh:
        qemu_err = fh.read(8192).decode("utf-8", "replace").strip()
    message = None if (timed_out or interrupted) else _read_guest_message(report_port)
    if message is not None and "guest_error" in message:
        raise PipguardError(f"in the VM: {message['guest_error']}", hint=message.get("hint"))
    vm = {"accel": accel, "machine": MACHINE, "qemu": tools.qemu, "kernel": tools.kernel.path,
          "memory_mb": _memory_mb(policy),
          "network": ({"proxy": f"127.0.0.1:{network.proxy.port}", "channel": "virtio-serial",
                       "connections": network.relay.opened} if network else "none"),
          "shares": [{"path": s.path, "writable": s.writable} for s in shares],
          "qemu_exit": proc.returncode, "guest_report": message is not None, "console_tail": tail}
    if qemu_err:
        vm["qemu_stderr"] = qemu_err[-2000:]
    guest = report_from_json(message) if message is not None else None
    error = None
    if interrupted:
        error = "interrupted: the VM was stopped by a signal to pipguard"
    elif timed_out:
        pass
    elif guest is None:
        error = ("the VM stopped before the guest sent its report (its kernel crashed, or its init "
                 "failed): see vm.console_tail")
    applied = ("vm", *guest.isolation.applied) if guest else ("vm",)
    unavailable = dict(guest.isolation.unavailable) if guest else {}
    if accel == "tcg":
        unavailable["vm.kvm"] = "software emulation (--vm-accel tcg) was asked for"
    events, attempts, dropped = _merge_proxy(guest, network, policy.max_events, message)
    return Report(
        command=tuple(plan.argv), exit_code=guest.exit_code if guest else None,
        timed_out=timed_out or bool(guest and guest.timed_out),
        isolation=LayerStatus(policy.isolation, applied, unavailable),
        events=events, processes=guest.processes if guest else (),
        network=attempts, files_written=tuple(written),
        env_removed=plan.env_removed, events_dropped=dropped,
        policy=policy.to_json(), host=host_summary(), cwd=plan.cwd, started_at=started_at,
        duration=round(time.time() - started_at, 4), error=error, tool_version=__version__,
        supervision=guest.supervision if guest else {},
        limits=dict(message.get("limits") or {}) if message else {},
        limit_hit=message.get("limit_hit") if message else None, vm=vm,
    )


__all__ = ["preflight", "run"]

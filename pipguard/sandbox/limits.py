"""Resource limits of one run: memory, processes, CPU time, bytes written.

Where pipguard can make a cgroup for the run, the limits hold for the run as a
whole (all its processes together) and the kernel enforces them:

- cgroup v2 (the unified hierarchy): a directory below pipguard's own cgroup.
  ``memory.max`` and ``pids.max`` only where the parent already delegates those
  controllers (its ``cgroup.subtree_control``): pipguard never changes a
  cgroup above its own run's. CPU time is read from ``cpu.stat`` (always
  there) and the run is killed when it passes the limit. ``cgroup.kill`` ends
  the run at once, and ``cgroup.procs`` is its exact membership.
- cgroup v1 (hybrid hosts like this project's development VM, where the
  memory and pids controllers are bound to v1): a directory below pipguard's
  own ``memory`` / ``pids`` cgroup, with ``memory.limit_in_bytes`` and
  ``pids.max``.

Otherwise rlimits, set in the sandbox's first process and inherited by every
process it starts, hold for each process separately: ``RLIMIT_AS`` (memory),
``RLIMIT_CPU`` (CPU seconds). The process count is then the supervisor's
(forks are notified and refused past the limit). Bytes written are always
``RLIMIT_FSIZE``: no single file may grow past the limit (``SIGXFSZ``), in any
mode. The report's ``limits`` says, for each, the value, what enforced it and
its scope.

What a run used of each limit is measured after it ends (:func:`recorded`,
the report's ``limits.*.used``), from the run's cgroups before they are
removed (``memory.peak`` / ``memory.max_usage_in_bytes``, ``pids.peak``,
``cpu.stat``: the whole run) or, where there is none, from the keeper's
``getrusage(RUSAGE_CHILDREN)`` (:class:`ChildUsage`: every process of the run
that was waited for), so that a user can size the limits from real runs.

The parsers (:func:`parse_size`, :func:`parse_count`, :func:`parse_seconds`)
are the ones every CLI flag uses (``--limit-memory 4G`` ...).
"""

from __future__ import annotations

import errno
import itertools
import time
import os
import re
import resource
import signal
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

from pipguard.errors import UsageError

#: Defaults (docs/sandbox.md, "Resource limits", measured on real builds).
DEFAULT_PROCESSES = 2048
DEFAULT_CPU_SECONDS = 4 * 3600.0
DEFAULT_WRITE_BYTES = 16 << 30
#: memory: this share of the host's RAM (resolved when the run starts)
DEFAULT_MEMORY_SHARE = 0.75

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_counter = itertools.count(1)


def parse_size(text: str, flag: str = "size") -> int:
    """``4G``, ``512M``, ``100k``, ``1048576``: bytes (binary units; a
    trailing ``B``/``iB`` is accepted). Raises UsageError."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f"{flag} {text!r}: expected a size such as 512M or 4G")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_count(text: str, flag: str = "count") -> int:
    """A positive whole number. Raises UsageError."""
    if not str(text).strip().isdigit() or int(text) < 1:
        raise UsageError(f"{flag} {text!r}: expected a positive whole number")
    return int(text)


def parse_seconds(text: str, flag: str = "seconds") -> float:
    """A positive number of seconds. Raises UsageError."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise UsageError(f"{flag} {text!r}: expected a positive number of seconds")
    return value


#: CLI flag -> Policy field (the same flags on run, install and sandbox)
FLAGS = {"--limit-memory": "limit_memory", "--limit-processes": "limit_processes",
         "--limit-cpu": "limit_cpu", "--limit-write": "limit_write"}


def policy_settings(memory: Optional[str] = None, processes: Optional[str] = None,
                    cpu: Optional[str] = None, write: Optional[str] = None) -> Dict[str, Any]:
    """The Policy settings for the ``--limit-*`` flags that were given (as
    typed: ``"4G"``, ``"500"``...): ``Policy(**policy_settings(...))``.
    None means the flag was not given (the Policy default holds)."""
    settings: Dict[str, Any] = {}
    if memory is not None:
        settings["limit_memory"] = parse_size(memory, "--limit-memory")
    if processes is not None:
        settings["limit_processes"] = parse_count(processes, "--limit-processes")
    if cpu is not None:
        settings["limit_cpu"] = parse_seconds(cpu, "--limit-cpu")
    if write is not None:
        settings["limit_write"] = parse_size(write, "--limit-write")
    return settings


def default_memory() -> int:
    """3/4 of the host's RAM: generous for any build, and never all of it."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * DEFAULT_MEMORY_SHARE)
    except (ValueError, OSError, AttributeError):
        return 8 << 30


@dataclass(frozen=True)
class AppliedLimit:
    """One limit as it was applied: ``by`` is ``cgroup2``, ``cgroup1``,
    ``rlimit`` or ``supervisor``; ``scope`` is ``run`` (all processes
    together), ``process`` (each one) or ``file`` (each file)."""

    value: float
    by: str
    scope: str

    def to_json(self) -> dict:
        return {"value": self.value, "by": self.by, "scope": self.scope}


@dataclass(frozen=True)
class Used:
    """What a run used of one limit, measured when it ended. ``value`` is in
    the limit's unit (bytes, processes, seconds); None: not measured, and
    ``how`` says why. ``how`` names the source (``cgroup1
    memory.max_usage_in_bytes``, ``rusage ru_maxrss``...); ``scope`` is
    ``run`` (all processes together), ``process`` (the largest single one)
    or ``file`` (the largest file). ``largest_file``: for ``write`` only,
    the largest file in the report's ``files_written``."""

    value: Optional[float]
    how: str
    scope: str
    largest_file: Optional[int] = None

    def to_json(self) -> dict:
        data = {"value": self.value, "how": self.how, "scope": self.scope}
        if self.largest_file is not None:
            data["largest_file"] = self.largest_file
        return data


@dataclass(frozen=True)
class ChildUsage:
    """``getrusage(RUSAGE_CHILDREN)`` of a run's keeper (pipguard.sandbox.keeper):
    every process of the run that was waited for — by its parent inside the
    run, or by the keeper (the first process, orphans) — and not the keeper
    itself. ``max_rss`` is the largest single process's resident peak, not a
    sum, and never below the caller's own size (the first process is a fork
    of the caller until it execs, and the kernel keeps that peak); ``written`` is what the kernel accounted as written to block storage
    (``ru_oublock`` × 512: tmpfs, pipes and sockets do not count; a file
    deleted before it reached the disk does)."""

    cpu_seconds: float
    max_rss: int
    written: int

    #: the keeper's line: ``usage UTIME_US STIME_US MAXRSS_KIB OUBLOCK``
    PREFIX = b"usage"

    @classmethod
    def from_fields(cls, fields: List[bytes]) -> Optional["ChildUsage"]:
        try:
            utime, stime, rss_kib, oublock = (int(f) for f in fields)
        except ValueError:
            return None
        return cls(round((utime + stime) / 1e6, 3), rss_kib * 1024, oublock * 512)


def _mounts() -> Tuple[Optional[str], Dict[str, str]]:
    """The cgroup2 mount point, and controller -> cgroup v1 mount point."""
    v2: Optional[str] = None
    v1: Dict[str, str] = {}
    try:
        with open("/proc/self/mountinfo") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if len(fields) < 5 or len(extra) < 3:
            continue
        if extra[0] == "cgroup2" and v2 is None:
            v2 = fields[4]
        elif extra[0] == "cgroup":
            for option in extra[2].split(","):
                v1.setdefault(option, fields[4])
    return v2, v1


def _own_cgroups() -> Dict[str, str]:
    """controller ("" for v2) -> pipguard's own cgroup path."""
    own = {}
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                _id, controllers, path = line.rstrip("\n").split(":", 2)
                for name in controllers.split(",") if controllers else [""]:
                    own[name] = path
    except (OSError, ValueError):
        pass
    return own


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _number_in(path: str, key: Optional[str] = None) -> Optional[int]:
    """The number in ``path`` (a one-value file such as ``memory.peak``), or
    the value of ``key`` in a ``name value`` file (``cpu.stat``); None when
    the file or the key is missing (an older kernel)."""
    try:
        text = _read(path)
        if key is None:
            return int(text.split()[0])
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _counter_in(path: str, key: str) -> int:
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


class RunCgroup:
    """The cgroups of one run (a v2 directory, v1 memory/pids directories):
    made before the run, the first process moved in before it execs, removed
    after. Which limits each enforces is in ``applied``."""

    def __init__(self) -> None:
        self.v2: Optional[str] = None
        self.v1: Dict[str, str] = {}  # controller -> directory
        #: pipguard's own cgroup.procs in the first hierarchy of :meth:`dirs`
        #: (its parent), for :meth:`move_kept_fast`
        self.own_procs: Optional[str] = None
        self.limits_cpu: Optional[float] = None
        self.unavailable: Dict[str, str] = {}
        self._oom_before = 0

    # ---------------------------------------------------------- membership
    def dirs(self) -> List[str]:
        return ([self.v2] if self.v2 else []) + list(self.v1.values())

    def add(self, pid: int) -> None:
        for directory in self.dirs():
            _write(os.path.join(directory, "cgroup.procs"), str(pid))

    def move_kept_fast(self) -> Optional["FastMove"]:
        """Start keeping the coming :meth:`add` from waiting for the kernel (see
        :class:`FastMove`); None where pipguard may not write its own cgroup."""
        if self.own_procs is None:
            return None
        try:
            # only where that file is where we are (a cgroup mount whose root is not the
            # hierarchy's would make the "no-op" a real move of pipguard)
            if str(os.getpid()) not in _read(self.own_procs).split():
                return None
            return FastMove(self.own_procs)
        except OSError:
            return None

    def members(self) -> Optional[Set[int]]:
        """Live members (None: no readable membership)."""
        for directory in self.dirs():
            try:
                pids = {int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split()}
            except (OSError, ValueError):
                continue
            return {p for p in pids if not _zombie(p)}
        return None

    def kill(self) -> bool:
        """Kill every member at once (cgroup v2 ``cgroup.kill``, Linux 5.14)."""
        if self.v2 is None:
            return False
        try:
            _write(os.path.join(self.v2, "cgroup.kill"), "1")
            return True
        except OSError:
            return False

    # ------------------------------------------------------------ counters
    def cpu_seconds(self) -> float:
        if self.v2 is None:
            return 0.0
        return _counter_in(os.path.join(self.v2, "cpu.stat"), "usage_usec") / 1e6

    def cpu_exceeded(self) -> bool:
        return self.limits_cpu is not None and self.cpu_seconds() > self.limits_cpu

    def memory_events(self) -> int:
        """OOM kills inside the run so far."""
        if self.v2 and "memory" in self.applied_controllers:
            return _counter_in(os.path.join(self.v2, "memory.events"), "oom_kill")
        if "memory" in self.v1:
            return _counter_in(os.path.join(self.v1["memory"], "memory.oom_control"), "oom_kill")
        return 0

    def pids_events(self) -> int:
        """Forks refused because the run had ``pids.max`` tasks."""
        if self.v2 and "pids" in self.applied_controllers:
            return _counter_in(os.path.join(self.v2, "pids.events"), "max")
        if "pids" in self.v1:
            return _counter_in(os.path.join(self.v1["pids"], "pids.events"), "max")
        return 0

    applied_controllers: Tuple[str, ...] = ()

    def peaks(self) -> Dict[str, Used]:
        """What the whole run used, from its cgroups: read before :meth:`remove`
        (the counters go with the directory). Only what this kernel has:
        ``memory.peak`` needs Linux 5.19, ``pids.peak`` 6.1 (v1 and v2)."""
        found: Dict[str, Used] = {}
        sources: List[Tuple[str, str, str, str, Optional[str]]] = []
        if self.v2 and "memory" in self.applied_controllers:
            sources.append(("memory", self.v2, "memory.peak", "cgroup2", None))
        elif "memory" in self.v1:
            sources.append(("memory", self.v1["memory"], "memory.max_usage_in_bytes", "cgroup1", None))
        if self.v2 and "pids" in self.applied_controllers:
            sources.append(("processes", self.v2, "pids.peak", "cgroup2", None))
        elif "pids" in self.v1:
            sources.append(("processes", self.v1["pids"], "pids.peak", "cgroup1", None))
        if self.v2:
            sources.append(("cpu", self.v2, "cpu.stat", "cgroup2", "usage_usec"))
        for name, directory, knob, version, key in sources:
            value = _number_in(os.path.join(directory, knob), key)
            if value is None:
                continue
            how = f"{version} {knob}" + (f" {key}" if key else "")
            if name == "memory":
                how += " (page cache included: the kernel reclaims it before an OOM kill)"
            found[name] = Used(round(value / 1e6, 3) if key == "usage_usec" else value, how, "run")
        return found

    def remove(self) -> None:
        for directory in self.dirs():
            for _ in range(50):
                try:
                    os.rmdir(directory)
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    time.sleep(0.01)  # the last member is being released


class FastMove:
    """Keeps the kernel's cgroup migration lock warm while a run is launched.

    Every move into a cgroup takes the kernel's global thread-group lock for
    writing (``cgroup_threadgroup_rwsem``), and the first writer after a quiet
    spell waits for an RCU grace period (``rcu_sync_enter``): 5-20 ms measured
    here for the command's move into its run cgroup, on every hook call's path
    to its ``exec``. A writer that comes while another has just been there
    does not wait (0.1-0.3 ms measured). So while the launch runs (the
    command's pid is known only at its end), a thread moves pipguard itself
    into the cgroup it is already in — a move that changes nothing — every
    2 ms: the grace period is waited for in that thread, beside the launch.
    Only pipguard's own pid, only into its own cgroup."""

    def __init__(self, own_procs: str) -> None:
        import threading  # not at start-up: most callers never need it

        from pipguard import threads

        self._stop = threading.Event()
        self._fd = os.open(own_procs, os.O_WRONLY | os.O_CLOEXEC)
        try:
            # with the caller's signals blocked, as every thread of pipguard's
            self._thread = threads.start(self._loop, name="pipguard-cgroup-warm")
        except BaseException:
            os.close(self._fd)
            raise

    #: a launch takes ~30 ms; past this the thread ends by itself (whatever happened to
    #: the launch: an interrupt between start and stop must not leave it running)
    LIFETIME = 2.0

    def _loop(self) -> None:
        pid = str(os.getpid()).encode()
        until = time.monotonic() + self.LIFETIME
        try:
            while time.monotonic() < until:
                try:
                    os.pwrite(self._fd, pid, 0)
                except OSError:
                    pass  # refused after the lock was taken (EBUSY, EACCES): it warmed all the same
                if self._stop.wait(0.002):
                    return
        finally:
            os.close(self._fd)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return True
    return data[data.rfind(b")") + 2:data.rfind(b")") + 3] == b"Z"


@dataclass(frozen=True)
class Prepared:
    """How one run's limits will be enforced."""

    cgroup: Optional[RunCgroup]
    rlimits: Tuple[Tuple[int, int, int], ...]
    applied: Dict[str, AppliedLimit]
    #: limit or mechanism -> why it could not be used (recorded in the report)
    unavailable: Dict[str, str]


def _clamped(resource_id: int, value: int, slack: int = 0) -> Tuple[int, int, int]:
    """(resource, soft, hard) no higher than the current hard limit: an
    unprivileged pipguard cannot raise it, and must not fail because of it.
    ``slack``: hard = soft + slack (RLIMIT_CPU: SIGXCPU at the soft limit,
    which names the cause; SIGKILL only at the hard one)."""
    _soft, hard = resource.getrlimit(resource_id)
    top = value + slack
    if hard != resource.RLIM_INFINITY:
        value, top = min(value, hard), min(top, hard)
    return (resource_id, value, top)


_swept: Set[str] = set()


def _sweep_once(parent: str) -> None:
    """Remove the empty run cgroups that a pipguard which was killed left below
    ``parent`` (``pipguard-PID-N`` of a PID that no longer exists): once per
    process and parent. rmdir removes only an empty cgroup; a live PID (or a
    reused one) is left alone, and so is anything made in the last minute (a
    pipguard whose PIDs we cannot see, in another PID namespace, has its run's
    cgroup empty for the few ms before the first process moves in)."""
    if parent in _swept:
        return
    _swept.add(parent)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        prefix, _, rest = name.partition("-")
        pid = rest.partition("-")[0]
        if prefix != "pipguard" or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except OSError:
            continue
        with _quiet():
            path = os.path.join(parent, name)
            if os.stat(path).st_mtime < time.time() - 60:
                os.rmdir(path)


def prepare(memory: int, processes: int, cpu: float, write: int) -> Prepared:
    """Make the run's cgroup(s) where possible, and the rlimits for the rest."""
    applied: Dict[str, AppliedLimit] = {}
    unavailable: Dict[str, str] = {}
    rlimits: List[Tuple[int, int, int]] = []
    cgroup = RunCgroup()
    name = f"pipguard-{os.getpid()}-{next(_counter)}"
    v2_mount, v1_mounts = _mounts()
    own = _own_cgroups()
    enforced = set()
    if v2_mount and "" in own:
        parent = os.path.join(v2_mount, own[""].lstrip("/"))
        try:
            delegated = _read(os.path.join(parent, "cgroup.subtree_control")).split()
            _sweep_once(parent)
            directory = os.path.join(parent, name)
            os.mkdir(directory, 0o755)
            cgroup.v2 = directory
            cgroup.own_procs = os.path.join(parent, "cgroup.procs")
            wanted = {"memory": ("memory.max", str(memory)), "pids": ("pids.max", str(processes))}
            done = []
            for controller, (knob, value) in wanted.items():
                if controller in delegated:
                    _write(os.path.join(directory, knob), value)
                    if controller == "memory" and os.path.exists(os.path.join(directory, "memory.swap.max")):
                        _write(os.path.join(directory, "memory.swap.max"), "0")
                    done.append(controller)
            cgroup.applied_controllers = tuple(done)
            enforced.update(done)
            cgroup.limits_cpu = cpu
            applied["cpu"] = AppliedLimit(cpu, "cgroup2", "run")
            enforced.add("cpu")
        except OSError as exc:
            unavailable["cgroup2"] = f"cannot make a cgroup below {parent}: {exc.strerror or exc}"
            if cgroup.v2:
                os.rmdir(cgroup.v2)
                cgroup.v2 = None
    else:
        unavailable["cgroup2"] = "no cgroup2 hierarchy mounted"
    for controller, knob, limit in (("memory", "memory.limit_in_bytes", memory),
                                    ("pids", "pids.max", processes)):
        if controller in enforced or controller not in v1_mounts or controller not in own:
            continue
        parent = os.path.join(v1_mounts[controller], own[controller].lstrip("/"))
        _sweep_once(parent)
        directory = os.path.join(parent, name)
        try:
            os.mkdir(directory, 0o755)
            cgroup.v1[controller] = directory
            if cgroup.own_procs is None:
                cgroup.own_procs = os.path.join(parent, "cgroup.procs")
            _write(os.path.join(directory, knob), str(limit))
            enforced.add(controller)
        except OSError as exc:
            unavailable[f"cgroup1.{controller}"] = f"cannot use {parent}: {exc.strerror or exc}"
            if controller in cgroup.v1:
                with _quiet():
                    os.rmdir(cgroup.v1.pop(controller))
    for controller in ("memory", "pids"):
        if controller in enforced:
            by = "cgroup2" if controller in cgroup.applied_controllers else "cgroup1"
            applied["memory" if controller == "memory" else "processes"] = AppliedLimit(
                memory if controller == "memory" else processes, by, "run")
    if "memory" not in enforced:
        rlimits.append(_clamped(resource.RLIMIT_AS, memory))
        applied["memory"] = AppliedLimit(rlimits[-1][1], "rlimit", "process")
    if "pids" not in enforced:
        applied["processes"] = AppliedLimit(processes, "supervisor", "run")
    if "cpu" not in enforced:
        seconds = int(max(1, round(cpu)))
        rlimits.append(_clamped(resource.RLIMIT_CPU, seconds, slack=2))
        applied["cpu"] = AppliedLimit(rlimits[-1][1], "rlimit", "process")
    rlimits.append(_clamped(resource.RLIMIT_FSIZE, write))
    applied["write"] = AppliedLimit(rlimits[-1][1], "rlimit", "file")
    return Prepared(cgroup if cgroup.dirs() else None, tuple(rlimits), applied, unavailable)


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


#: signal that ends a process over an rlimit -> limit name
RLIMIT_SIGNALS: Dict[int, str] = {int(signal.SIGXCPU): "cpu", int(signal.SIGXFSZ): "write"}


def measure(prepared: Prepared, usage: Optional[ChildUsage],
            largest_file: Optional[int] = None) -> Dict[str, Used]:
    """What the run used of each limit: the run's cgroup where it has the
    counter (all processes together), else the keeper's rusage, else "not
    measured". Call before the cgroup is removed."""
    peaks = prepared.cgroup.peaks() if prepared.cgroup is not None else {}
    if "memory" not in peaks:
        peaks["memory"] = (Used(usage.max_rss, "rusage ru_maxrss: the largest process's resident peak "
                                "(RLIMIT_AS counts its address space, which is larger)", "process")
                           if usage else Used(None, "not measured: no memory cgroup and no rusage", "process"))
    if "processes" not in peaks:
        peaks["processes"] = Used(None, "not measured: no pids cgroup (the supervisor counts forks "
                                  "to enforce the limit, not a peak; processes lists them all)", "run")
    if "cpu" not in peaks:
        peaks["cpu"] = (Used(usage.cpu_seconds, "rusage ru_utime + ru_stime of the run's processes "
                             "that were waited for", "run")
                        if usage else Used(None, "not measured: no cgroup2 and no rusage", "run"))
    peaks["write"] = (Used(usage.written, "rusage ru_oublock x 512: bytes written to block storage "
                           "by the run's processes that were waited for", "run", largest_file)
                      if usage else Used(None, "not measured: no rusage", "run", largest_file))
    return peaks


def recorded(prepared: Prepared, usage: Optional[ChildUsage],
             largest_file: Optional[int] = None) -> Dict[str, dict]:
    """The report's ``limits``: each limit as applied (``value``, ``by``,
    ``scope``) and what the run used of it (``used``, :func:`measure`)."""
    used = measure(prepared, usage, largest_file)
    return {name: dict(limit.to_json(), used=used[name].to_json())
            for name, limit in prepared.applied.items()}

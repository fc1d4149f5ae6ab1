"""Launch backends: what surrounds the OS layer of a run.

Below the rest of the sandbox: a backend imports the OS layer, ``rules`` and the base, never
the plan or the API (the plan takes backends, not the other way round).

A backend decides the world the sandbox's first process confines itself in
before the OS layer (:mod:`pipguard.sandbox.oslayer`: no_new_privs, capability drop,
Landlock, seccomp) goes on — those stay on under every backend:

- ``plain``: the host's own filesystem, process table and network; the OS
  layer and the supervisor are the walls (the default);
- ``ns`` (:mod:`pipguard.sandbox.backends.ns`): user, mount, pid, net, ipc and uts
  namespaces: a new root built from the plan's grants, a pid namespace whose
  pid 1 is pipguard's, loopback only, decoy credentials at the real home;
- ``vm`` (:mod:`pipguard.sandbox.vm`): a QEMU guest running the whole pipeline, at the
  sandbox's layer (it takes the plan), so it is not a module here.

The contract, written down so the VM backend has a place to plug in:

1. **From the plan** a backend takes only plan data, never the Policy:
   :func:`spec_for` (per backend) is a pure function of the
   :class:`~pipguard.sandbox.plan.Plan`'s grants (read, write and device paths, the
   homes, the network mode) and returns a frozen, JSON-able spec. The spec
   travels to the forked first process in the launcher's config (``"ns"``).
2. **In the first process**, before the OS layer, :meth:`Backend.enter`
   builds the world and returns in the process that goes on to confine itself
   and exec the command; every other process it makes (for ns: the
   namespace's creator and its pid 1) never returns from it. A failure is
   sent on the launcher's control socket as ``{"error", "hint"}`` (exit 2 at
   the CLI), never run around.
3. **To the launcher** it gives :class:`Entered`: the host pid of the
   process that sent the status line (found by the kernel's SCM_CREDENTIALS,
   not by anything the sandbox says), pipguard's own helper processes inside
   the sandbox (not the command's: never reported as lingering), and
   evidence descriptors (for ns: an inotify fd on the decoys) the launcher
   takes with ``pidfd_getfd``. Process records keep host pids: the
   supervisor sees host pids in seccomp notifications.
4. :meth:`Backend.probe` says whether the backend works on this host and,
   per part, why not (for ``doctor`` and, later, ``auto``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple

try:  # Protocol is in typing from 3.8
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore[assignment,misc]

#: the backends the launcher starts (the VM backend runs its own launcher, pipguard.sandbox.vm.runner)
BACKENDS = ("plain", "ns")


@dataclass(frozen=True)
class Part:
    """One feature a backend needs; ``reason`` is "" when it works."""

    name: str
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason


@dataclass(frozen=True)
class Probe:
    """Whether a backend works here: every part it needs, each ok or why not.
    ``available`` is True only when every part is ok."""

    backend: str
    parts: Tuple[Part, ...]

    @property
    def available(self) -> bool:
        return all(p.ok for p in self.parts)

    @property
    def reason(self) -> str:
        """The first missing part and why ("" when available)."""
        for part in self.parts:
            if not part.ok:
                return f"{part.name}: {part.reason}"
        return ""

    def to_json(self) -> Dict[str, Any]:
        return {"backend": self.backend, "available": self.available,
                "parts": {p.name: p.reason or "ok" for p in self.parts}}


@dataclass(frozen=True)
class Entered:
    """What a backend's first process tells the launcher (point 3 above).

    - ``command_pid``: host pid of the process that confines itself and
      execs the command (under ``plain`` it is the first process itself);
    - ``helpers``: host pids of pipguard's own processes inside the sandbox
      (ns: its pid 1), left out of the command's process tree;
    - ``evidence_fds``: name -> an fd the launcher took from a helper with
      ``pidfd_getfd``, now the caller's to read and close (ns: ``"decoys"``,
      the inotify fd on the decoy credentials; ``"tmpfs:/tmp"`` and
      ``"tmpfs:/dev/shm"``, handles on the namespace's own tmpfs, which keep
      them readable after the namespace is gone);
    - ``evidence_info``: what the reader of those fds needs (ns: ``"decoys"``,
      inotify watch descriptor -> decoy path);
    - ``pid_namespace``: pids the sandbox names are not host pids (the
      supervisor must not compare them with host pids; the kernel already
      keeps the sandbox from naming anything outside).
    """

    command_pid: int
    helpers: Tuple[int, ...] = ()
    evidence_fds: Dict[str, int] = field(default_factory=dict)
    pid_namespace: bool = False
    evidence_info: Dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """The interface each backend module implements (module-level functions
    in the module or package named after it: ``pipguard.sandbox.backends.ns``,
    whose ``__init__`` names them)."""

    name: str

    def probe(self) -> Probe:
        """What works here (cached per process; never raises)."""

    def spec_for(self, plan: Any) -> Mapping[str, Any]:
        """The JSON-able spec of one run, from the plan alone."""

    def enter(self, spec: Mapping[str, Any], control_fd: int) -> None:
        """In the forked first process, before the OS layer: build the world.
        Returns only in the process that goes on to exec the command."""

    def before_exec(self) -> None:
        """In that process, after the launcher's acknowledgement, right before
        the execve: settle what must hold from the command's first instruction
        (ns: its pid 1 made not dumpable, once the launcher took its fds)."""


def load(backend: str):
    """The module of ``backend`` (one of :data:`BACKENDS`). The launcher's first
    process imports nothing after the fork: it gets these before."""
    from pipguard.sandbox.backends import ns, plain

    modules = {"ns": ns, "plain": plain}
    if backend not in modules:
        raise ValueError(f"unknown backend {backend!r}")
    return modules[backend]

"""The namespace backend (``--isolation ns``): each run in a world of its own.

Before the OS layer goes on (Landlock, seccomp, no_new_privs and the
capability drop all stay on inside), the sandbox's first process creates
user + mount + pid + net + ipc + uts namespaces with the kernel API (ctypes:
``os.unshare`` is Python >= 3.12 only) and builds a new root from the plan's
grants. What the sandbox then cannot reach is *absent*, not refused:

- a new root (a tmpfs, ``pivot_root``): read-only binds of the granted
  system dirs, interpreter prefixes and read roots; the build dir and the
  write roots read-write; a private tmpfs ``/tmp`` and ``/dev/shm``; a
  minimal ``/dev``; the new pid namespace's own ``/proc``; at each real
  home's path a tmpfs holding **decoy** credentials (the real homes are not
  in the namespace at all);
- one uid mapped: the sandbox is its host uid, never 0 on the host (host
  files of other owners show as the overflow uid). As root, pipguard first
  switches to the overflow uid (65534), and the write roots reach the
  sandbox through idmapped mounts (their owner on disk appears as that uid,
  files it creates belong to the owner on disk): nothing on the host is
  chowned or ACL'ed;
- a net namespace with only ``lo`` (up), unless the plan allows all network;
- pid 1 is pipguard's small init; when the command ends, its status goes out
  at once and everything left in the namespace dies with the namespace (the
  supervisor first records it as lingering, as under ``plain``).

The fork structure (keeper, F, pid 1, the command's process) is in
:mod:`~pipguard.sandbox.backends.ns.forked`.

Where this follows bubblewrap (containers/bubblewrap ``bubblewrap.c``, read
for this backend) and where not:

- follows: the setup order (make ``/`` a slave, a tmpfs on ``/tmp`` as the
  base, ``newroot``/``oldroot`` inside it, ``pivot_root(base, oldroot)``,
  binds from ``/oldroot``, ``/proc`` mounted while the old root is still
  there (the kernel refuses a procfs in a user namespace without a fully
  visible one), ``oldroot`` made rprivate and detached, then the second
  ``pivot_root(".", ".")``); its minimal ``/dev`` (null zero full random
  urandom tty bound from the host, ``fd``/``stdin``... symlinks, ``shm``);
  ``setgroups`` denied before ``gid_map``; ``PR_SET_DUMPABLE`` after a uid
  switch (our /proc files must be ours to write the maps); its
  pid-1-reaper ``do_init`` that reports the initial process's status;
  read-only flags kept together with the ones the kernel locked (we use
  ``mount_setattr``, which changes only the bits named, where bwrap
  re-reads the flags and remounts);
- differs: no setuid mode and no privilege-separated helper — as root we
  create the idmapped mounts first and then become an unprivileged uid, so
  every namespace operation is an unprivileged one; loopback is brought up
  with ``SIOCSIFFLAGS`` (the kernel adds 127.0.0.1 to ``lo`` itself) where
  bwrap speaks rtnetlink; no devpts (so no root mapping needed, bwrap's
  reason for its second user namespace); bwrap's seccomp/caps options are
  pipguard's OS layer, applied after this in the command's process; TIOCSTI
  is handled by the OS layer's seccomp filter and the new session, as
  bwrap's ``--new-session`` does.

What the sandbox wrote may not keep (setuid, setgid, world-write: on the host it is root's)
is put back after the run by :mod:`pipguard.sandbox.filemodes`, for every backend; what it
left in its own ``/tmp`` and ``/dev/shm`` is listed by :mod:`pipguard.sandbox.files`.

The modules, lowest first (none imports a later one):

- ``spec`` — the spec as plain data (:class:`NamespaceSpec`, :func:`spec_for`, the layout's
  paths): no kernel call, the plan's;
- ``decoys`` — the decoy tables, their planting and the watch's reader (``DecoyWatch``): no
  kernel call, the plan's and the launcher's;
- ``kernel`` — constants and ctypes syscalls, the uid switch, the idmap user namespace;
- ``root`` — the new root: idmapped trees, the pivots, each mount, the decoy homes watched;
- ``forked`` — :func:`enter` and the processes it makes (F, pid 1, the command's);
- ``probing`` — :func:`probe`, part by part in a throw-away child.

This package is the backend's module (``backends.load("ns")``: ``name``, :func:`enter`,
:func:`probe`) and imports all of them: everything that runs after the fork imports nothing
(the caller may have had other threads) and writes only with ``os.write``, so the first
process imports this package, and with it every module its forked side runs, before it forks.
"""

from __future__ import annotations

from pipguard.sandbox.backends.ns import decoys, kernel, root  # noqa: F401 (the forked side's: before any fork)
from pipguard.sandbox.backends.ns.forked import before_exec, enter
from pipguard.sandbox.backends.ns.probing import probe
from pipguard.sandbox.backends.ns.spec import NamespaceSpec, name, spec_for

__all__ = ["NamespaceSpec", "before_exec", "enter", "name", "probe", "spec_for"]

"""What the user asked for: a frozen, validated :class:`Policy`.

A policy says nothing about the host; :mod:`pipguard.sandbox.plan` resolves it against
the host's facts. Empty allow-lists mean "nothing beyond the defaults":
pipguard fails closed.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from pipguard.sandbox import limits
from pipguard.errors import PolicyError, UsageError

ISOLATION_LEVELS = ("auto", "audit", "os", "ns", "vm")
#: how the VM backend runs its guest (``isolation="vm"``): "kvm" (must work
#: here, probed) or "tcg" (software emulation, slow: for review, never chosen silently)
VM_ACCELS = ("kvm", "tcg")


@dataclass(frozen=True)
class HostPort:
    """A network destination the sandbox may reach (``--allow-host``).

    ``port`` None means any port of that host.
    """

    host: str
    port: Optional[int] = None

    @classmethod
    def parse(cls, text: str, option: str = "--allow-host") -> "HostPort":
        """``HOST[:PORT]`` (``[v6]:PORT``); errors name ``option``, the flag it came from."""
        text = text.strip()
        if not text:
            raise UsageError(f"{option} needs HOST[:PORT], got an empty value")
        host, port_text = text, None  # type: Tuple[str, Optional[str]]
        if text.startswith("["):  # [::1]:443
            end = text.find("]")
            if end < 0:
                raise UsageError(f"{option} {text!r}: unbalanced '['")
            host, rest = text[1:end], text[end + 1 :]
            if rest:
                if not rest.startswith(":"):
                    raise UsageError(f"{option} {text!r}: expected ':PORT' after ']'")
                port_text = rest[1:]
        elif text.count(":") == 1:
            host, port_text = text.split(":")
        port = None
        if port_text is not None:
            if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
                raise UsageError(f"{option} {text!r}: port must be 1-65535")
            port = int(port_text)
        return cls(host=_host_name(host, text, option, bracketed=text.startswith("[")), port=port)

    def __str__(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return shown if self.port is None else f"{shown}:{self.port}"


#: one label of a DNS name as a host may carry it (RFC 1123: letters, digits, inner hyphens;
#: and the underscore, which resolvers take and some internal hosts have)
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)\Z")


def _host_name(host: str, text: str, option: str, *, bracketed: bool) -> str:
    """``host`` if it is an IP address (IPv6 only in brackets, or bare without a port) or a
    DNS name (``xn--`` IDNA for a non-ASCII one); a UsageError otherwise: ``a b``,
    ``socket(inet6, dgram)``, ``a..b``, ``-x`` name no host and would never match one."""
    import ipaddress

    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        if bracketed and address.version != 6:
            raise UsageError(f"{option} {text!r}: only an IPv6 address goes in brackets")
        return host
    bad = UsageError(f"{option} {text!r}: not HOST[:PORT] (a DNS name or an IP address, "
                     "[IPv6]:PORT with a port)", hint="e.g. pypi.org, files.pythonhosted.org:443, 10.0.0.5:8080, [::1]:3128")
    if bracketed:
        raise bad
    try:
        ascii_name = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise bad from None
    labels = ascii_name[:-1].split(".") if ascii_name.endswith(".") else ascii_name.split(".")
    if len(ascii_name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise bad
    if labels[-1].isdigit():  # 1.2.3 or 999.1.1.1: an address that is none, not a name
        raise bad
    return ascii_name


def _absolute_existing(paths: Tuple[str, ...], flag: str) -> Tuple[str, ...]:
    out = []
    for path in paths:
        full = os.path.realpath(os.path.abspath(os.path.expanduser(str(path))))
        if not os.path.exists(full):
            raise UsageError(
                f"{flag} {path}: no such file or directory",
                hint="create it first, or fix the path",
            )
        out.append(full)
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Policy:
    """The sandbox policy for one run.

    Defaults are the safe ones: no network, subprocesses allowed (builds need
    compilers), writes only to the working directory and a private temp dir,
    reads of home directories denied, the environment reduced to what a build
    needs.

    - ``allow_network``: True lifts the network ban entirely (destinations are
      still recorded). False, with ``allow_hosts`` empty, means no network at all.
    - ``allow_hosts``: only these destinations (used by ``install`` for the
      package index); empty means none. Contradicts ``allow_network=True``.
    - ``allow_subprocess``: False vetoes every process creation.
    - ``allow_write`` / ``allow_read``: extra roots, beyond the working
      directory (read-write) and the system directories (read-only). Empty
      means no extra roots. Paths must exist.
    - ``keep_env``: names of environment variables to pass through unchanged
      beyond the built-in allow-list. Empty means the allow-list only.
    - ``isolation``: ``auto`` (every layer the kernel has, degraded parts
      recorded), ``os`` (fail if any OS-layer part is missing), ``ns`` (as
      ``os``, inside user/mount/pid/net/ipc/uts namespaces: fail if they are
      unavailable; ``auto`` chooses it where it works, see ``prefer_ns``), ``audit`` (Python audit
      hooks only, for non-Linux hosts), ``vm`` (a QEMU guest
      running the layers above: :mod:`pipguard.sandbox.vm`; never chosen by
      ``auto``).
    - ``vm_accel``: under ``vm``, ``kvm`` (fails when KVM does not work
      here) or ``tcg`` (software emulation, slow). Ignored otherwise.
    - ``timeout``: seconds; None means no limit.
    - ``writable_cwd``: the working directory is the build dir and writable.
    - ``private_roots``: directories that hold other tenants' data (``install``:
      pip's temporary area, where the other builds of the install live); a
      read below them outside the grants is a finding (``foreign-read``), not
      only refused. Empty: none.
    - ``observe_reads``: ask the supervisor to observe every ``open`` for
      evidence of native reads (costly; Landlock blocks them either way).
      None (the default) means on, except under the namespace backend (``ns``,
      or ``auto`` where it chose ns), where the decoy credentials report native
      credential reads without it.
    - ``read_only_by_landlock``: extra read-only roots, as ``allow_read``,
      whose read-only-ness is Landlock's alone: the namespace backend binds
      them without the mount's read-only flag, so ``access(W_OK)`` answers
      from the files' modes rather than ``EROFS`` (makepkg tests its settings
      directories with ``[[ -w ]]`` and stops when that fails). Landlock still
      refuses every write there and the refusal is reported; where Landlock is
      missing they are bound read-only as usual. Empty: none.
    - ``prefer_ns``: under ``auto``, run in the namespace backend where this
      host supports it (probed once per process), else in the plain one with
      the reason recorded. False: ``auto`` stays on the host's own
      filesystem (PKGBUILD review and the VM guest: ns is not offered there).
    - Resource limits (:mod:`pipguard.sandbox.limits` says how each is enforced; the
      report's ``limits`` what was): ``limit_processes`` live processes at
      once (default 2048); ``limit_memory`` bytes (None: 3/4 of the host's
      RAM); ``limit_cpu`` CPU seconds (default 4 hours); ``limit_write``
      bytes, the largest file the sandbox may write (default 16 GiB).
      Hitting one ends the run (or that process) with a ``limit-*`` event.
    """

    allow_network: bool = False
    allow_hosts: Tuple[HostPort, ...] = ()
    allow_subprocess: bool = True
    allow_write: Tuple[str, ...] = ()
    allow_read: Tuple[str, ...] = ()
    keep_env: Tuple[str, ...] = ()
    isolation: str = "auto"
    timeout: Optional[float] = None
    writable_cwd: bool = True
    observe_reads: Optional[bool] = None
    max_events: int = 10000
    limit_processes: int = limits.DEFAULT_PROCESSES
    limit_memory: Optional[int] = None
    limit_cpu: float = limits.DEFAULT_CPU_SECONDS
    limit_write: int = limits.DEFAULT_WRITE_BYTES
    private_roots: Tuple[str, ...] = ()
    vm_accel: str = "kvm"
    prefer_ns: bool = True
    read_only_by_landlock: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_LEVELS:
            raise PolicyError(
                f"unknown isolation {self.isolation!r}",
                hint=f"use one of: {', '.join(ISOLATION_LEVELS)}",
            )
        if self.vm_accel not in VM_ACCELS:
            raise PolicyError(f"unknown vm_accel {self.vm_accel!r}", hint=f"use one of: {', '.join(VM_ACCELS)}")
        if self.allow_network and self.allow_hosts:
            raise PolicyError(
                "allow_network and allow_hosts contradict each other",
                hint="--allow-network already allows every host; drop one of them",
            )
        if self.timeout is not None:
            if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)):
                raise PolicyError(f"timeout must be a number of seconds, got {self.timeout!r}")
            if not self.timeout > 0:
                raise PolicyError(f"timeout must be positive, got {self.timeout!r}")
        for name in self.keep_env:
            if not name or "=" in name:
                raise PolicyError(f"--keep-env {name!r} is not a variable name")
        if self.max_events < 1:
            raise PolicyError("max_events must be at least 1")
        for name in ("limit_processes", "limit_memory", "limit_cpu", "limit_write"):
            value = getattr(self, name)
            if value is None and name == "limit_memory":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                    or (name != "limit_cpu" and not float(value).is_integer()):
                raise PolicyError(f"{name} must be a positive {'number' if name == 'limit_cpu' else 'whole number'}, "
                                  f"got {value!r}")
            object.__setattr__(self, name, float(value) if name == "limit_cpu" else int(value))
        hosts = tuple(h if isinstance(h, HostPort) else HostPort.parse(str(h)) for h in self.allow_hosts)
        object.__setattr__(self, "allow_hosts", hosts)
        object.__setattr__(self, "allow_write", _absolute_existing(tuple(self.allow_write), "--allow-write"))
        object.__setattr__(self, "allow_read", _absolute_existing(tuple(self.allow_read), "--allow-read"))
        object.__setattr__(self, "read_only_by_landlock",
                           _absolute_existing(tuple(self.read_only_by_landlock), "read_only_by_landlock"))
        object.__setattr__(self, "private_roots", _absolute_existing(tuple(self.private_roots),
                                                                     "private_roots"))
        object.__setattr__(self, "keep_env", tuple(self.keep_env))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "Policy":
        """Build a policy from keyword settings; unknown keys are errors."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise PolicyError(
                f"unknown policy setting(s): {', '.join(unknown)}",
                hint=f"known settings: {', '.join(sorted(known))}",
            )
        return cls(**values)

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["allow_hosts"] = [str(h) for h in self.allow_hosts]
        for key in ("allow_write", "allow_read", "keep_env", "private_roots", "read_only_by_landlock"):
            data[key] = list(data[key])
        return data



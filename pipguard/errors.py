"""The one exception tree of pipguard.

Every error a user can see is a :class:`PipguardError` carrying a one-line
message, an optional hint, and whose fault it is. The CLI prints
``error: <message>`` (plus ``hint: <hint>``) and exits with ``exit_code``;
nothing below the CLI prints.
"""

from __future__ import annotations

from typing import Optional

from pipguard import exitcodes


class PipguardError(Exception):
    """Base class: something went wrong that the user should be told about."""

    exit_code = exitcodes.ERROR
    #: Who should act: "user" (bad input), "host" (a kernel feature is
    #: missing), "package" (the package under test misbehaved), "pipguard".
    blame = "pipguard"

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(PipguardError):
    """The caller asked for something that cannot work (bad flag, path, value)."""

    blame = "user"


class PolicyError(UsageError):
    """A policy is contradictory or names an unknown setting."""


class CommandNotFound(UsageError):
    """The command to sandbox does not exist or is not executable."""


class LayerUnavailable(PipguardError):
    """A required isolation layer is not available on this host.

    Raised for ``--isolation os`` when the kernel lacks a part of the OS layer;
    ``auto`` degrades instead and records the reason in the report.
    """

    blame = "host"


class KernelError(PipguardError):
    """A syscall that sets up the sandbox failed; keeps the errno."""

    blame = "host"

    def __init__(self, syscall: str, errno_: int, strerror: str, hint: Optional[str] = None) -> None:
        super().__init__(f"{syscall} failed: {strerror} (errno {errno_})", hint)
        self.syscall = syscall
        self.errno = errno_


class ReportWriteError(UsageError):
    """The report file cannot be written."""


class PipError(PipguardError):
    """pip failed (resolution, download, or a build that errored)."""

    blame = "package"


class SandboxUserError(PipguardError):
    """pipguard runs as root and cannot prepare the unprivileged sandbox user
    (no free uid, a filesystem without POSIX ACLs, a bad state directory)."""

    blame = "host"

"""Who answers the seccomp notifications of a run.

Two responders, one contract: every notification gets exactly one answer,
and every one that needs a decision with evidence reaches the handlers
(pipguard/sandbox/handlers.py) through the supervisor's dispatch
(:meth:`pipguard.sandbox.supervisor.Supervisor._dispatch`).

- **Python** (always there): the supervisor's loop reads the listener itself
  and dispatches each notification.
- **Native** (:class:`NativeResponder`, the C thread of
  ``pipguard/sandbox/_responder.c``, optional): answers CONTINUE for the frequent
  opens the rule table's fast prefixes allow without evidence (~4 µs each,
  no GIL), and forwards everything else, raw, through a pipe that the
  supervisor reads and dispatches as if it had read the listener. Without
  the extension, or on an unknown architecture, the Python responder answers
  everything (same evidence, slower).
"""

from __future__ import annotations

import os
import select
from typing import Dict, List, Mapping, Optional, Sequence

from pipguard.sandbox import notify

#: the open-like syscalls the native thread knows, by name -> its code
_OPEN_KINDS = {"open": 1, "creat": 2, "openat": 3, "openat2": 4}


class NativeResponder:
    """A running native responder thread; :meth:`start` or None."""

    def __init__(self, handle, forward_r: int, stop_r: int, stop_w: int) -> None:
        self._handle = handle
        #: readable when the thread forwarded notifications (the supervisor selects on it)
        self.forward_fd = forward_r
        self._stop_r, self._stop_w = stop_r, stop_w
        self._buffer = b""

    @classmethod
    def start(cls, listener: int, *, arch: Optional[int], names: Mapping[int, str],
              tables: Mapping[str, Sequence[str]], write_mask: int) -> Optional["NativeResponder"]:
        """Hand ``listener`` to a new thread with the rule table's fast
        ``tables`` (fixed_fast, read_fast, write_fast, never_fast). None when
        the Python responder must answer everything (no extension, unknown
        architecture, PIPGUARD_PYTHON_RESPONDER set, or the thread failed)."""
        if arch is None or os.environ.get("PIPGUARD_PYTHON_RESPONDER"):
            return None
        try:
            from pipguard.sandbox import _responder  # type: ignore[attr-defined]
        except ImportError:
            return None
        forward_r, forward_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        stop_r, stop_w = os.pipe2(os.O_CLOEXEC)
        try:
            handle = _responder.start(
                listener=listener, forward_fd=forward_w, stop_fd=stop_r, arch=arch,
                kinds={nr: _OPEN_KINDS[name] for nr, name in names.items() if name in _OPEN_KINDS},
                **{table: [os.fsencode(p) for p in tables[table]]
                   for table in ("fixed_fast", "read_fast", "write_fast", "never_fast")},
                write_mask=write_mask)
        except (OSError, ValueError):
            for fd in (forward_r, forward_w, stop_r, stop_w):
                os.close(fd)
            return None
        # forward_w belongs to the thread from now on: it closes it when it ends
        return cls(handle, forward_r, stop_r, stop_w)

    def forwarded(self) -> Optional[List[notify.Notification]]:
        """What the thread forwarded since the last call (whole notifications
        only); None at end of file: the thread has ended."""
        try:
            data = os.read(self.forward_fd, notify.NOTIF_SIZE * 64)
        except BlockingIOError:
            return []
        if not data:
            return None
        self._buffer += data
        size = notify.NOTIF_SIZE
        whole = len(self._buffer) - len(self._buffer) % size
        chunk, self._buffer = self._buffer[:whole], self._buffer[whole:]
        return [notify.decode(chunk[offset:offset + size]) for offset in range(0, whole, size)]

    def pending(self) -> bool:
        return bool(select.select([self.forward_fd], [], [], 0)[0])

    def stop(self) -> Dict[str, object]:
        """Stop and join the thread; its figures for the report's ``supervision``.
        Call :meth:`forwarded` afterwards until it is empty: what the thread
        forwarded before it stopped still needs an answer; then :meth:`close`."""
        from pipguard.sandbox import _responder  # type: ignore[attr-defined]

        os.write(self._stop_w, b"x")
        answered, _forwarded, error, cpu_seconds = _responder.join(self._handle)
        figures: Dict[str, object] = {"responder": "native", "answered_natively": answered,
                                      "native_cpu_ms": round(cpu_seconds * 1000, 1)}
        if error:
            figures["responder_error"] = os.strerror(error)
        return figures

    def close(self) -> None:
        for fd in (self.forward_fd, self._stop_r, self._stop_w):
            os.close(fd)

"""pipguard's own threads, started so that they never take the caller's signals.

A signal sent to the process (Ctrl-C, ``kill PID``) goes to one thread that
does not block it, and the kernel may pick any of them. Python runs its
handler in the main thread, but a main thread asleep in ``epoll_wait`` (the
supervisor's loop) is only woken when the signal hits *it*: one that landed
on a helper thread (the decoy watch, the proxy) waited, unnoticed, until the
sandbox ended on its own — a Ctrl-C that did nothing. So every thread
pipguard starts blocks the signals the caller's program handles; they reach
the main thread, as if pipguard had started no thread at all.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Optional, Sequence

#: the signals a caller's main thread may handle: only it may receive them
CALLER_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                            signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD,
                            signal.SIGWINCH, signal.SIGPIPE})


def start(target: Callable[..., Any], *, name: Optional[str] = None, args: Sequence[Any] = (),
          daemon: bool = True, begin: bool = True) -> threading.Thread:
    """A thread running ``target(*args)`` with :data:`CALLER_SIGNALS` blocked
    (it inherits the mask it is created with; the caller's mask is restored
    at once). ``begin=False``: created only, ``.start()`` it later via
    :func:`begin_thread`."""
    thread = threading.Thread(target=target, name=name, args=tuple(args), daemon=daemon)
    if begin:
        begin_thread(thread)
    return thread


def begin_thread(thread: threading.Thread) -> None:
    """Start ``thread`` with :data:`CALLER_SIGNALS` blocked in it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, CALLER_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)

"""Where the command line's text leaves for the user: made safe (:func:`_echo`), coloured
only on a terminal (:func:`_color`), and an error as one line with a hint and an exit code
(:func:`_fail`).

Imports the base layer and :mod:`pipguard.report.render.safe` only; click only for a stream
that is not a plain text file (the fast path never imports it).
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from pipguard import exitcodes
from pipguard.report.render import safe

_ANSI = None
#: the ``--format`` values that are data for machines (JSON text), not text for a human
_DATA_FORMATS = ("json", "sarif")


def _color(stream) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def _plain_text_stream(stream) -> bool:
    """A stream click.echo would write to as it is: a text file with a
    non-ASCII encoding (click re-wraps ASCII-configured streams as UTF-8)."""
    import io

    if type(stream) is not io.TextIOWrapper or not stream.encoding or not stream.errors:
        return False
    import codecs

    try:
        return codecs.lookup(stream.encoding).name != "ascii"
    except LookupError:
        return True


def _echo(text: str, *, err: bool = False, data: bool = False) -> None:
    """Where pipguard's text leaves for a terminal (or a log, a pipe into
    ``less -R``...): made safe first (:mod:`pipguard.report.render.safe`): for a
    human, every control character and escape sequence but pipguard's own
    colours is escaped visibly (:func:`~pipguard.report.render.safe.terminal_text`);
    ``data`` (JSON, SARIF): the same characters as JSON ``\\u`` escapes, the
    same data (:func:`~pipguard.report.render.safe.json_text`). Then exactly
    ``click.echo(text, err=err, nl=False)``: for a plain text stream click
    writes the text (ANSI codes stripped when the stream is not a terminal)
    and flushes; anything unusual is left to click itself."""
    global _ANSI
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    text = safe.json_text(text) if data else safe.terminal_text(text)
    if not _plain_text_stream(stream):
        import click

        click.echo(text, err=err, nl=False)
        return
    if text and "\x1b" in text:
        try:
            tty = stream.isatty()
        except Exception:
            tty = False
        if not tty:
            if _ANSI is None:
                import re

                _ANSI = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")  # click's strip_ansi
            text = _ANSI.sub("", text)
    if text:
        stream.write(text)
    stream.flush()


def _fail(message: str, hint: Optional[str] = None, code: int = exitcodes.ERROR) -> None:
    """One line on stderr: the problem, then what to do."""
    # one line: a message can quote a package's name, a path, an argv
    line = f"pipguard: error: {safe.printable(message)}"
    if hint:
        line += f" (hint: {safe.printable(hint)})"
    _echo(line + "\n", err=True)
    raise SystemExit(code)

"""Text on its way to a terminal: what pipguard prints, and a build's output.

Paths, argv, host names, package names and versions, and a build's output are
chosen by the package. Printed raw, they could drive the terminal that shows
them: OSC 52 writes the clipboard, ``ESC ] 0 ;`` sets the window title,
``ESC [ 2 J`` clears the screen, ``\\r`` and ``ESC [ 1 A`` move the cursor back
over pipguard's verdict and print a fake "Successfully installed" in its
place, and bidi overrides (U+202E) reorder what is shown. One rule decides
what is unsafe, everywhere: **every character ``str.isprintable()`` refuses**
-- the C0 controls (ESC, BEL, ``\\r``, backspace...), DEL, the C1 controls
U+0080-U+009F (U+009B is CSI on terminals that read 8-bit controls), bidi
embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069) and the
other format characters, line and paragraph separators, lone surrogates (the
bytes of invalid UTF-8) -- except where the text means them: ``\\n`` and
``\\t`` in multi-line text. An unsafe character is shown escaped, visibly
(``\\x1b``, ``\\u202e``), never dropped: the reader sees that it was there.

- :func:`printable`: one value on one line (a cell, a progress line, an
  error message): every unsafe character escaped, ``\\n`` too.
- :func:`terminal_text`: pipguard's own multi-line output (the renderers'
  text, at the CLI's boundary): ``\\n``, ``\\t`` and the few colour sequences
  pipguard itself writes (:data:`OWN_SGR`) stay, everything else unsafe is
  escaped; a colour a package put in a value is escaped like any other
  sequence (``ESC [ 8 m`` would conceal the rest of the summary).
- :func:`json_text`: JSON for machines stays exact data. ``json.dumps``
  already writes the C0 controls as ``\\u001b``; with ``ensure_ascii=False``
  C1 controls and bidi overrides would be raw, so each unsafe character is
  rewritten as its ``\\uXXXX`` escape, which a JSON reader decodes back to
  the same character (they only ever occur inside JSON strings).
- :class:`BuildOutputFilter`: the bytes a hook call writes, on their way to
  pip (which shows them on a failure or with ``-v``). Plain colour (SGR,
  ``ESC [`` digits/``;``/``:`` ``m``: gcc, cmake, ninja, pytest) is kept, and
  a line that set one ends with a reset (``ESC [ 0 m``) so colour never leaks
  into pip's or pipguard's lines; ``\\r\\n`` stays; every other unsafe
  character -- the ESC of any other sequence (OSC, DCS, APC, PM, cursor
  movement, erase, title), a lone ``\\r``, C1 -- is escaped as above. A
  sequence split across two writes is judged whole.
"""

from __future__ import annotations

import codecs
import re
from typing import List, Match, Optional

#: The colour sequences pipguard's renderers write (red, green, yellow, bold, reset): the only
#: escape sequences :func:`terminal_text` lets through.
OWN_SGR = ("\x1b[0m", "\x1b[1m", "\x1b[31m", "\x1b[32m", "\x1b[33m")
#: what ends a line whose colour a build set
RESET = "\x1b[0m"

#: anything but printable ASCII (the common case is skipped by the regex engine, in C)
_UNUSUAL = re.compile(r"[^\x20-\x7e]+")
_UNUSUAL_OR_NEWLINE = re.compile(r"[^\x20-\x7e\n\t]+")
_OWN_OR_UNUSUAL = re.compile("|".join(re.escape(s) for s in OWN_SGR) + r"|\x1b|[^\x20-\x7e\n\t\x1b]+")


def escape_char(ch: str) -> str:
    """``ch`` as a visible escape: ``\\x1b``, ``\\u202e``, ``\\U000e0001``; a byte that
    was not UTF-8 (a lone surrogate of ``surrogateescape``) as the byte: ``\\x9b``."""
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:
        code -= 0xDC00
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escape_unsafe(run: str, keep: str = "") -> str:
    """``run`` with each character ``isprintable()`` refuses (and not in ``keep``) escaped."""
    if run.isprintable():
        return run
    return "".join(ch if ch.isprintable() or ch in keep else escape_char(ch) for ch in run)


def printable(text: str) -> str:
    """``text`` on one line: every non-printable character escaped (``\\x1b``,
    ``\\n``, ``\\u202e``): controls, ANSI sequences, bidi overrides and other
    format characters. Strings from the sandboxed program (paths, argv,
    hostnames) pass through this before a human sees them, so a package cannot
    repaint the terminal, hide text or start a line of its own."""
    if text.isprintable():
        return text
    return _UNUSUAL.sub(lambda m: _escape_unsafe(m.group()), text)


def terminal_text(text: str) -> str:
    """pipguard's own text for a human, as it leaves for the terminal: lines
    (``\\n``), tabs and pipguard's colours (:data:`OWN_SGR`) stay; every other
    unsafe character is escaped. Idempotent on what it returns."""
    if "\x1b" not in text:  # the common case: no colour to keep
        return _UNUSUAL_OR_NEWLINE.sub(lambda m: _escape_unsafe(m.group(), "\n\t"), text)
    return _OWN_OR_UNUSUAL.sub(_own_or_escaped, text)


def _own_or_escaped(match: Match[str]) -> str:
    run = match.group()
    return run if run in OWN_SGR else _escape_unsafe(run, "\n\t")


def json_text(text: str) -> str:
    """JSON text (from ``json.dumps``) with every character ``isprintable()``
    refuses, other than its own newlines and indentation, written as its
    ``\\uXXXX`` escape: the same data to a JSON reader, inert on a terminal."""
    if text.isascii() and "\x7f" not in text:
        return text  # json.dumps escaped C0 itself
    return _UNUSUAL_OR_NEWLINE.sub(lambda m: "".join(
        ch if ch.isprintable() or ch in "\n\t" else _json_escape(ch) for ch in m.group()), text)


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code > 0xFFFF:  # a surrogate pair, as JSON spells it
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


#: one step of the build output filter: a colour, CRLF, a character to judge, or a run of
#: plain ASCII text
_BUILD_TOKEN = re.compile(r"\x1b\[[0-9;:]*m|\r\n|\x1b|\r|[^\x20-\x7e\n\t\r\x1b]+")
#: the same, and every line end: while a colour is set (the line's end resets it)
_BUILD_TOKEN_OR_NEWLINE = re.compile(r"\x1b\[[0-9;:]*m|\r?\n|\x1b|\r|[^\x20-\x7e\n\t\r\x1b]+")
#: the end of a chunk that may be the start of a kept sequence: held for the next write
_INCOMPLETE = re.compile(r"(?:\x1b(?:\[[0-9;:]*)?|\r)\Z")
#: the bytes of plain lines: printable ASCII, newline, tab
_PLAIN_BYTES = bytes(range(0x20, 0x7f)) + b"\n\t"
#: a colour sequence longer than this is not a colour: escaped rather than held
_LONGEST_HELD = 64


class BuildOutputFilter:
    """Incremental: :meth:`feed` the bytes of each read, :meth:`close` at the
    end of the stream; each returns the bytes to pass on. Input is read as
    UTF-8 (bytes that are not valid UTF-8 are escaped as ``\\x..``, which
    also catches the 8-bit C1 controls); output is UTF-8."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self._held = ""
        self._colored = False  # a colour was set on the current line and not reset

    def feed(self, data: bytes) -> bytes:
        if not self._held and not self._colored and not data.translate(None, _PLAIN_BYTES) \
                and not self._decoder.getstate()[0]:
            return data  # printable ASCII lines and tabs only: the common case, as it is (bytes.translate: C)
        text = self._held + self._decoder.decode(data)
        self._held = ""
        incomplete = _INCOMPLETE.search(text, max(0, len(text) - _LONGEST_HELD))
        if incomplete is not None:
            text, self._held = text[:incomplete.start()], incomplete.group()
        return self._filter(text).encode("utf-8", "surrogateescape")

    def close(self) -> bytes:
        """The rest: what was held (now complete or not), and a reset if a colour is still set."""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        out = self._filter(text)
        if self._colored:
            out += RESET
            self._colored = False
        return out.encode("utf-8", "surrogateescape")

    def _filter(self, text: str) -> str:
        if not text:
            return ""
        if text.replace("\n", "").replace("\t", "").isprintable():  # plain lines, no control (C: fast)
            if self._colored and "\n" in text:
                return self._end_lines(text)
            return text
        out: List[str] = []
        last = 0
        while True:
            match = (_BUILD_TOKEN_OR_NEWLINE if self._colored else _BUILD_TOKEN).search(text, last)
            if match is None:
                break
            out.append(text[last:match.start()])
            last = match.end()
            token = match.group()
            if token[0] == "\x1b" and len(token) > 1:
                out.append(token)
                self._colored = token not in ("\x1b[m", "\x1b[0m")
            elif token in ("\n", "\r\n"):
                if self._colored:
                    out.append(RESET)
                    self._colored = False
                out.append(token)
            else:  # a lone ESC or \r, or a run of other characters to judge
                out.append(_escape_unsafe(token))
        out.append(text[last:])
        return "".join(out)

    def _end_lines(self, text: str) -> str:
        head, newline, rest = text.partition("\n")
        self._colored = False
        return head + RESET + newline + rest


def filter_build_output(data: bytes, filt: Optional[BuildOutputFilter] = None) -> bytes:
    """``data`` as one whole stream through a :class:`BuildOutputFilter`."""
    filt = filt or BuildOutputFilter()
    return filt.feed(data) + filt.close()


__all__ = ["OWN_SGR", "RESET", "BuildOutputFilter", "escape_char", "filter_build_output", "json_text",
           "printable", "terminal_text"]

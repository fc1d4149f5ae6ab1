"""pipguard.report.render.safe: what pipguard prints and a build's output never drive the terminal
(issue 33: OSC 52 clipboard writes, clear screen, window titles, cursor moves over the verdict)."""
from __future__ import annotations

import json
import os
import re

import pytest

from pipguard.install import buildoutput
from pipguard.report.render.safe import (OWN_SGR, BuildOutputFilter, filter_build_output, json_text, printable,
                                  terminal_text)

#: one sample of each class of sequence or character a package could use on a terminal
HOSTILE = {
    "osc52-clipboard": "\x1b]52;c;cGlwZ3VhcmQ=\x07",
    "osc-title-st": "\x1b]0;title\x1b\\",
    "clear-screen": "\x1b[2J",
    "cursor-up": "\r\x1b[1A",
    "cursor-position": "\x1b[1;1H",
    "erase-line": "\x1b[2K",
    "dcs": "\x1bPq#0;2;0;0;0\x1b\\",
    "apc": "\x1b_payload\x1b\\",
    "pm": "\x1b^payload\x1b\\",
    "csi-private": "\x1b[?1049h",
    "single-shift": "\x1bN",
    "conceal-sgr": "\x1b[8m",
    "c1-csi": "\x9b2J",
    "c1-osc": "\x9d0;title\x9c",
    "bel": "\x07",
    "backspace": "abc\x08\x08\x08xyz",
    "carriage-return": "real\rfake",
    "del": "\x7f",
    "nul": "\x00",
    "bidi-override": "\u202eevil",
    "bidi-isolate": "\u2066x\u2069",
    "line-separator": "a\u2028b",
    "zero-width": "a\u200bb",
}

#: what no text leaving pipguard may hold: any ESC that does not start a colour, and every
#: character str.isprintable() refuses but newline and tab
_UNSAFE_ESC = re.compile(r"\x1b(?!\[[0-9;:]*m)")


def _unsafe_chars(text: str) -> list:
    return [ch for ch in _UNSAFE_ESC.sub("", text).replace("\x1b", "")
            if not ch.isprintable() and ch not in "\n\t"]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_printable_escapes_every_class_visibly(name):
    value = HOSTILE[name]
    shown = printable(f"pkg {value} end\nnext")
    assert shown.isprintable(), shown
    assert "\\x0a" in shown  # one line: a value cannot start a line of its own
    assert shown.startswith("pkg ") and shown.endswith(" end\\x0anext")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_terminal_text_keeps_lines_and_own_colours_only(name):
    value = HOSTILE[name]
    text = f"\x1b[31mREFUSED\x1b[0m — {value}\n\tnext line\n"
    out = terminal_text(text)
    assert out.startswith("\x1b[31mREFUSED\x1b[0m — ")
    assert out.endswith("\n\tnext line\n")
    assert not _unsafe_chars(out), out
    assert _UNSAFE_ESC.search(out) is None, out
    if name != "conceal-sgr":
        assert "\x1b[8m" not in out
    assert terminal_text(out) == out


def test_terminal_text_escapes_colours_pipguard_does_not_write():
    # a package's own colour in a value could conceal (8) or paint black on black
    for sgr in ("\x1b[8m", "\x1b[30;40m", "\x1b[38;5;16m", "\x1b[m"):
        assert terminal_text(f"a{sgr}b") == "a\\x1b" + sgr[1:] + "b"
    for sgr in OWN_SGR:  # also right after a non-ASCII character (a shortened cell's ellipsis)
        assert terminal_text(f"…{sgr}x") == f"…{sgr}x"


def test_json_text_is_the_same_data_and_inert():
    value = {"member": "".join(HOSTILE.values()), "plain": "é ü ✓"}
    for ensure_ascii in (True, False):
        text = json.dumps(value, indent=2, ensure_ascii=ensure_ascii)
        out = json_text(text)
        assert json.loads(out) == value
        assert "\x1b" not in out and not _unsafe_chars(out), out
    assert "é ü ✓" in json_text(json.dumps(value, ensure_ascii=False))


# ----------------------------------------------------------------- the build output filter
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_build_output_filter_escapes_every_class(name):
    out = filter_build_output(f"before {HOSTILE[name]} after\n".encode()).decode()
    assert not _unsafe_chars(out), out
    assert _UNSAFE_ESC.search(out) is None, out
    # a colour is kept (conceal too: it ends with its line, reset before the newline)
    assert out.startswith("before ") and out.endswith(" after\x1b[0m\n" if name == "conceal-sgr" else " after\n")


def test_build_output_filter_keeps_honest_colour_and_resets_each_line():
    honest = (b"\x1b[1m\x1b[31merror:\x1b[0m x.c:1: \x1b[01;35m\x1b[Kwarning\x1b[m\n"
              b"[ 50%] \x1b[32mBuilding C object\x1b[0m\n")
    out = filter_build_output(honest)
    # gcc's ESC[K (erase to end of line) is not a colour: escaped; the colours stay
    assert out == honest.replace(b"\x1b[K", b"\\x1b[K")
    # a colour left set at the end of a line is reset there: it never reaches pip's next line
    assert filter_build_output(b"\x1b[8mhidden\nshown\n") == b"\x1b[8mhidden\x1b[0m\nshown\n"
    assert filter_build_output(b"\x1b[30;40mblack") == b"\x1b[30;40mblack\x1b[0m"
    assert filter_build_output(b"crlf\r\nok\n") == b"crlf\r\nok\n"
    text = "naïve ✓ “quoted”\n".encode()
    assert filter_build_output(text) == text


def test_build_output_filter_escapes_bytes_that_are_not_utf8():
    # 0x9b alone is CSI on a terminal that reads 8-bit controls; 0xc2 0x9b is U+009B
    assert filter_build_output(b"a\x9b2Jb \xc2\x9b2J\n") == b"a\\x9b2Jb \\x9b2J\n"
    assert filter_build_output(b"\xff\xfe\n") == b"\\xff\\xfe\n"


def _split_everywhere(data: bytes):
    for cut in range(1, len(data)):
        filt = BuildOutputFilter()
        yield cut, filt.feed(data[:cut]) + filt.feed(data[cut:]) + filt.close()


@pytest.mark.parametrize("data", [
    b"x\x1b]52;c;cGlwZ3VhcmQ=\x07y\n",
    b"x\r\x1b[1ASuccessfully installed fake\n",
    b"\x1b[32mgreen\x1b[0m \x1b[2J\r\n",
    "a\u202eb \xe9\n".encode() + b"\xc2\x9b2J",
])
def test_build_output_filter_judges_a_sequence_split_across_writes(data):
    whole = filter_build_output(data)
    for cut, out in _split_everywhere(data):
        assert out == whole, (cut, out)


def test_build_output_filter_one_byte_at_a_time():
    data = b"\x1b" + b"]52;c;QUJD\x07" + b"\x1b[3" + b"1mred\x1b[0m\r" + b"\n\x1b"
    filt = BuildOutputFilter()
    out = b"".join(filt.feed(data[i:i + 1]) for i in range(len(data))) + filt.close()
    assert out == b"\\x1b]52;c;QUJD\\x07\x1b[31mred\x1b[0m\r\n\\x1b"


def test_build_output_filter_does_not_hold_a_long_sequence():
    # a colour "in progress" is held for the next write, but only so long
    filt = BuildOutputFilter()
    out = filt.feed(b"\x1b[" + b"1;" * 100)
    assert out.startswith(b"\\x1b[1;")


# ----------------------------------------------------------------- the relay
def test_relay_copies_filtered_output_into_the_target_pipe_until_every_writer_is_gone():
    read_end, target = os.pipe()
    with os.fdopen(read_end, "rb") as reader:
        relay = buildoutput.Relay(target, target)
        out, err = relay.start()
        assert out == err  # one pipe for both: the order of stdout and stderr lines stays
        child = os.fork()
        if child == 0:  # a writer that outlives our own write end, as the sandboxed call does
            os.write(out, b"\x1b")
            os.write(out, b"]52;c;QUJD\x07 \x1b[32mok\x1b[0m\n")
            os._exit(0)
        relay.finish()
        os.waitpid(child, 0)
        os.close(target)  # the relay's own copy is closed: end of file after what it copied
        assert reader.read() == b"\\x1b]52;c;QUJD\\x07 \x1b[32mok\x1b[0m\n"


def test_relay_keeps_two_distinct_pipes_apart():
    pipes = [os.pipe(), os.pipe()]
    relay = buildoutput.Relay(pipes[0][1], pipes[1][1])
    out, err = relay.start()
    assert out != err
    os.write(out, b"to stdout\x1b[2J\n")
    os.write(err, b"to stderr\n")
    relay.finish()
    for _r, w in pipes:
        os.close(w)
    got = [os.read(r, 4096) for r, _w in pipes]
    for r, _w in pipes:
        os.close(r)
    assert got == [b"to stdout\\x1b[2J\n", b"to stderr\n"]

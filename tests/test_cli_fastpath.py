"""``pipguard run``, ``install`` and ``sandbox`` are parsed without click for well-formed
command lines (start-up cost). Those parsers must never disagree with click: for every
command line they accept, they must produce exactly the parameters click would call the
command with; everything else they must leave to click (None)."""

from __future__ import annotations

import itertools

import click
import pytest

from pipguard.cli import app as cli
from pipguard.cli import options

OPTIONS = [
    [], ["--allow-network"], ["--deny-subprocess"], ["--no-observe-reads"], ["--observe-reads"],
    ["--record-build-dir"],
    ["--isolation", "os"], ["--isolation=audit"], ["--isolation", "bogus"], ["--isolation"],
    ["--timeout", "2.5"], ["--timeout=1e3"], ["--timeout", "0"], ["--timeout", "-1"], ["--timeout", "x"],
    ["--timeout", "nan"], ["--timeout", "inf"],
    ["--format", "json"], ["--format=sarif"], ["--format", "xml"],
    ["--report", "r.json"], ["--report=r.json"], ["--report", "-"], ["--report="],
    ["--allow-host", "pypi.org"], ["--allow-host", "a:1", "--allow-host=b:2"],
    ["--allow-write", "/tmp/x"], ["--allow-read", "/opt"], ["--keep-env", "CC"], ["--keep-env=CFLAGS"],
    ["--isolation", "os", "--isolation", "audit"], ["--allow-network=1"], ["-h"], ["--help"],
    ["--allow-net"], ["--allow-write", "--"], ["extra"], ["--timeout", "3", "--timeout", "4"],
]
COMMANDS = [["--", "true"], ["--", "sh", "-c", "exit 3"], ["--"], ["--", "--", "x"], ["true"],
            ["--", "--allow-network"]]


def click_params(argv):
    """What click calls ``run`` with for ``argv``, or None where click refuses it."""
    try:
        ctx = cli.run.make_context("run", list(argv[1:]))
    except click.exceptions.Exit:
        return None
    except click.ClickException:
        return None
    return ctx.params


def cases():
    for first, second in itertools.combinations_with_replacement(range(len(OPTIONS)), 2):
        for command in COMMANDS:
            yield ["run", *OPTIONS[first], *OPTIONS[second], *command]


@pytest.mark.parametrize("chunk", range(4))
def test_fast_parser_agrees_with_click(chunk, capsys):
    checked = 0
    for i, argv in enumerate(cases()):
        if i % 4 != chunk:
            continue
        fast = options._fast_run_params(list(argv))
        if fast is None:
            continue  # click parses it, as before
        checked += 1
        expected = click_params(argv)
        assert expected is not None, f"fast path accepted what click refuses: {argv}"
        assert fast == expected, argv
    capsys.readouterr()  # click's usage messages for refused lines
    assert checked > 50  # the fast path really takes the common lines


# -- install and sandbox: pipguard's options among pip's arguments ------------------------
INSTALL_OPTIONS = [
    [], ["--sandbox"], ["--sandbox=1"], ["--python", "/usr/bin/python3"], ["--python=/x/python"],
    ["--python"], ["--python", "-q"], ["--isolation", "ns"], ["--isolation=vm"], ["--isolation", "bogus"],
    ["--vm-accel", "tcg"], ["--build-timeout", "30"], ["--build-timeout=0"], ["--build-timeout", "x"],
    ["--allow-build-host", "crates.io"], ["--allow-read", "/opt", "--allow-read=/srv"],
    ["--limit-memory", "2G"], ["--keep-env", "CC"], ["--no-observe-reads"], ["--observe-reads"],
    ["--probe-imports"], ["--report", "r.json"], ["--pip-report", "p.json"], ["--format", "json"],
    ["--format", "xml"], ["--policy", "pipguard.toml"], ["--report="], ["-h"], ["--help"],
    ["--isolation", "os", "--isolation", "ns"], ["--pol"],
]
PIP_ARGS = [
    ["six"], [".[test]"], ["-e", "."], ["-r", "requirements.txt"], ["--no-index", "--find-links", "d", "x"],
    ["--index-url=https://u:p@h/simple", "x"], ["-qq", "x"], ["-qh", "x"], ["--", "x"], ["-", "x"],
    ["-rreq-hash.txt"], [], ["--target", "t", "x"], ["--upgrade", "--sandbox"],
]


def click_install_params(command, argv):
    try:
        ctx = getattr(cli, command).make_context(command, list(argv))
    except (click.exceptions.Exit, click.ClickException):
        return None
    return ctx.params


@pytest.mark.parametrize("command", ["install", "sandbox"])
def test_fast_install_parser_agrees_with_click(command, capsys):
    checked = 0
    for first, second in itertools.combinations_with_replacement(range(len(INSTALL_OPTIONS)), 2):
        for pip in PIP_ARGS:
            for argv in ([*INSTALL_OPTIONS[first], *pip, *INSTALL_OPTIONS[second]],
                         [*pip, *INSTALL_OPTIONS[first], *INSTALL_OPTIONS[second]]):
                fast = options._fast_install_params([command, *argv])
                if fast is None:
                    continue
                checked += 1
                expected = click_install_params(command, argv)
                assert expected is not None, f"fast path accepted what click refuses: {argv}"
                assert fast == (command, expected), argv
    capsys.readouterr()
    assert checked > 500


"""Renderers are pure functions of a Report, so the tests build Reports directly."""

from __future__ import annotations

import json
import posixpath
import re

import pytest

from pipguard.errors import UsageError
from pipguard.report.render import FORMATS, get, printable
from pipguard.report.render import json as json_render
from pipguard.report.render import markdown, sarif, table
from pipguard.report.model import (
    SCHEMA,
    Event,
    FileWritten,
    LayerStatus,
    NetworkAttempt,
    ProcessRecord,
    Report,
)

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ISOLATION = LayerStatus("auto", ("os", "audit"), {"supervisor": "no seccomp user notification"})


def make(**kw) -> Report:
    base = dict(
        command=("python", "setup.py", "bdist_wheel"),
        exit_code=0,
        timed_out=False,
        isolation=ISOLATION,
        tool_version="0.1.0",
        cwd="/tmp/build",
        started_at=1700000000.0,
        duration=2.5,
    )
    base.update(kw)
    return Report(**base)


def ev(seq, kind="file-read", action="blocked", target="/home/u/.ssh/id_rsa", pid=43,
       rule="secrets", layer="os", **detail) -> Event:
    return Event(seq, float(seq), kind, action, layer, pid, target, rule, detail)


PROCS = (
    ProcessRecord(42, 1, ("/usr/bin/python3", "setup.py", "bdist_wheel"), 1),
    ProcessRecord(43, 42, ("/bin/sh", "-c", "cat ~/.ssh/id_rsa"), -9, True),
)


@pytest.fixture
def blocked_report() -> Report:
    return make(
        exit_code=1,
        events=(
            ev(3, "network", target="evil.example:443", pid=42, rule="no-network",
               python="/tmp/build/setup.py:12", seen_by=["audit", "os"]),
            ev(1),
            ev(2, "file-write", "allowed", "/tmp/build/out.o", rule=""),
        ),
        processes=PROCS,
        network=(NetworkAttempt("inet", "tcp", "93.184.216.34", 443, "evil.example", "blocked", 42),),
        files_written=(FileWritten("/tmp/build/out.o", "0123456789abcdef" * 4, 2048),),
        env_removed=("AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN"),
    )


# -- registry ----------------------------------------------------------------


def test_formats_and_get():
    assert FORMATS == ("table", "json", "sarif", "markdown")
    assert get("markdown") is markdown.render
    assert get("table") is table.render
    assert get("json") is json_render.render
    assert get("sarif") is sarif.render


def test_get_unknown_is_usage_error():
    with pytest.raises(UsageError) as info:
        get("xml")
    assert "xml" in info.value.message
    assert "table, json, sarif, markdown" in info.value.hint


@pytest.mark.parametrize("fmt", FORMATS)
def test_renderers_are_pure_and_deterministic(fmt, blocked_report, capsys):
    render = get(fmt)
    first = render(blocked_report)
    assert first == render(blocked_report)
    assert first.endswith("\n")
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


# -- json --------------------------------------------------------------------


def test_json_is_to_json(blocked_report):
    data = json.loads(json_render.render(blocked_report))
    assert data == json.loads(json.dumps(blocked_report.to_json()))
    assert data["schema"] == SCHEMA
    assert data["verdict"] == "blocked"
    assert json_render.render(blocked_report, color=True) == json_render.render(blocked_report)


# -- table -------------------------------------------------------------------


def test_table_clean_headline():
    out = table.render(make(processes=PROCS[:1]))
    head = out.splitlines()[0]
    assert head.startswith("pipguard: CLEAN")
    assert "exit 0" in head
    assert "isolation: os, audit (requested auto)" in head
    assert "unavailable: supervisor: no seccomp user notification" in head
    assert "observed clean in this run is evidence, not proof" in head
    assert "Blocked" not in out
    assert "Network" not in out and "Files written" not in out and "Environment" not in out
    assert "Processes (1):" in out
    assert not ANSI.search(out)


def test_table_clean_color_is_green():
    out = table.render(make(), color=True)
    assert "\x1b[32m" in out and "\x1b[31m" not in out
    assert ANSI.sub("", out) == table.render(make())


def test_table_blocked_sections_in_order(blocked_report):
    out = table.render(blocked_report)
    head = out.splitlines()[0]
    assert head.startswith("pipguard: BLOCKED (2 attempts)")
    assert "evidence, not proof" not in head
    titles = [line for line in out.splitlines() if line.endswith(":") and "(" in line]
    assert [t.split(" (")[0] for t in titles] == [
        "Blocked", "Processes", "Network", "Files written", "Environment variables removed",
    ]
    assert out.index("Blocked (2):") < out.index("Processes (2):")
    assert not ANSI.search(out)


def test_blocked_rows_content(blocked_report):
    out = table.blocked_table(blocked_report.events, blocked_report.processes)
    lines = out.splitlines()
    assert lines[0] == "Blocked (2):"
    assert lines[1].split() == ["kind", "target", "process", "layer", "rule", "python"]
    rows = lines[3:]
    assert len(rows) == 2  # the allowed event is not listed
    # seq order, not report order
    assert rows[0].split() == ["file-read", "/home/u/.ssh/id_rsa", "43", "(sh)", "os", "secrets"]
    assert rows[1].split() == [
        "network", "evil.example:443", "42", "(python3)", "audit,os", "no-network",
        "/tmp/build/setup.py:12",
    ]


def test_blocked_table_reusable_without_python_column_or_process():
    out = table.blocked_table([ev(1, pid=999), ev(2, action="allowed")], [])
    assert "python" not in out
    assert out.splitlines()[3].split() == ["file-read", "/home/u/.ssh/id_rsa", "999", "os", "secrets"]
    assert table.blocked_table([ev(1, action="allowed")], PROCS) == ""
    assert table.blocked_table([], []) == ""


def test_table_blocked_color(blocked_report):
    out = table.render(blocked_report, color=True)
    assert "\x1b[31m" in out
    assert "\x1b[32m" not in out
    assert "\x1b[31mfile-read\x1b[0m" in out


def test_table_other_rows(blocked_report):
    out = table.render(blocked_report)
    assert "signal 9 (SIGKILL), killed by pipguard" in out
    assert "/bin/sh -c 'cat ~/.ssh/id_rsa'" in out
    assert "evil.example/93.184.216.34:443" in out
    assert ["/tmp/build/out.o", "2048", "0123456789ab"] in [line.split() for line in out.splitlines()]
    assert "AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN" in out


def test_table_timed_out():
    out = table.render(make(exit_code=-9, timed_out=True, duration=30.0))
    head = out.splitlines()[0]
    assert head.startswith("pipguard: CLEAN")
    assert "timed out after 30.0s, killed by signal 9 (SIGKILL)" in head


def test_table_signal():
    head = table.render(make(exit_code=-11)).splitlines()[0]
    assert "killed by signal 11 (SIGSEGV)" in head
    assert "timed out" not in head


def test_table_error_never_started():
    out = table.render(make(exit_code=None, error="python: command not found"), color=True)
    head = out.splitlines()[0]
    assert "ERROR" in head and "not run: python: command not found" in head
    assert "\x1b[33m" in head
    assert "evidence, not proof" not in head


def test_table_dropped_events():
    assert "1 further event dropped" in table.render(make(events_dropped=1))
    assert "7 further events dropped" in table.render(make(events_dropped=7)).splitlines()[-1]
    assert "dropped" not in table.render(make())


def test_table_no_isolation_applied():
    head = table.render(make(isolation=LayerStatus("audit"))).splitlines()[0]
    assert "isolation: none (requested audit)" in head
    assert "unavailable" not in head


def test_table_long_tables_are_bounded():
    events = tuple(ev(i, target=f"/secret/{i}") for i in range(120))
    procs = tuple(ProcessRecord(i, 1, ("/bin/true",) + ("x" * 50,) * 4, 0) for i in range(1000, 1060))
    env = tuple(f"VAR_{i}" for i in range(70))
    out = table.render(make(events=events, processes=procs, env_removed=env))
    assert "Blocked (120):" in out
    assert "/secret/49" in out and "/secret/50" not in out
    assert "… and 70 more (see --report)" in out
    assert "Processes (60):" in out
    assert "… and 10 more (see --report)" in out
    assert "VAR_49," in out and "VAR_50" not in out
    assert "… and 20 more (see --report)" in out
    for line in out.splitlines():
        if line.startswith("1000 "):
            argv = line.split(None, 3)[3]
            assert len(argv) == table.MAX_CELL and argv.endswith("…")
    assert len(out.splitlines()) < 150


def test_table_escapes_untrusted_text():
    nasty = "/tmp/\x1b[2J\rok\u202eevil"
    out = table.render(make(
        events=(ev(1, target=nasty),),
        processes=(ProcessRecord(43, 1, ("/bin/\x1b[31msh",), 0),),
    ))
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert "/tmp/\\x1b[2J\\x0dok\\u202eevil" in out
    assert printable("plain text") == "plain text"
    assert printable("\U000e0001") == "\\U000e0001"


# -- sarif -------------------------------------------------------------------


def _sarif(report: Report) -> dict:
    return json.loads(sarif.render(report))


def test_sarif_structure(blocked_report):
    log = _sarif(blocked_report)
    assert log["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    assert log["version"] == "2.1.0"
    assert len(log["runs"]) == 1
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "pipguard"
    assert driver["version"] == "0.1.0"
    assert driver["informationUri"].startswith("https://")
    rule_ids = [r["id"] for r in driver["rules"]]
    assert rule_ids == sorted(rule_ids) == ["no-network", "secrets"]
    for rule in driver["rules"]:
        assert rule["shortDescription"]["text"]
        assert rule["help"]["text"]
        assert rule["defaultConfiguration"] == {"level": "error"}
    results = run["results"]
    assert len(results) == len(blocked_report.blocked_events) == 2
    for res in results:
        assert res["ruleId"] in rule_ids
        assert rule_ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] == "error"
        assert res["message"]["text"]
        assert len(res["locations"]) == 1
    assert [r["properties"]["seq"] for r in results] == [1, 3]


def test_sarif_result_content(blocked_report):
    first, second = _sarif(blocked_report)["runs"][0]["results"]
    assert first["message"]["text"] == "Blocked file-read of /home/u/.ssh/id_rsa by pid 43 (sh) [os]"
    assert first["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == "pid 43 (sh)"
    assert first["properties"] == {
        "seq": 1, "pid": 43, "layer": "os", "kind": "file-read", "target": "/home/u/.ssh/id_rsa",
    }
    assert second["message"]["text"] == (
        "Blocked network of evil.example:443 by pid 42 (python3) [os]"
    )
    phys = second["locations"][0]["physicalLocation"]
    assert phys["artifactLocation"]["uri"] == "file:///tmp/build/setup.py"
    assert phys["region"]["startLine"] == 12
    assert second["properties"]["python"] == "/tmp/build/setup.py:12"
    assert second["properties"]["seen_by"] == ["audit", "os"]


def test_sarif_python_locations():
    report = make(exit_code=1, events=(
        ev(1, python="build/setup.py:7"),
        ev(2, python="<string>:3"),
        ev(3, python="/a b/setup.py"),
        ev(4, rule=""),
    ))
    run = _sarif(report)["runs"][0]
    locs = [r["locations"][0] for r in run["results"]]
    assert locs[0]["physicalLocation"] == {
        "artifactLocation": {"uri": "build/setup.py", "uriBaseId": "CWD"},
        "region": {"startLine": 7},
    }
    assert run["originalUriBaseIds"] == {"CWD": {"uri": "file:///tmp/build/"}}
    assert "logicalLocations" in locs[1]  # <string> is not a file
    assert locs[2]["physicalLocation"] == {"artifactLocation": {"uri": "file:///a%20b/setup.py"}}
    assert run["results"][3]["ruleId"] == sarif.UNNAMED_RULE
    assert sarif.UNNAMED_RULE in [r["id"] for r in run["tool"]["driver"]["rules"]]


def test_sarif_clean():
    log = _sarif(make(events=(ev(1, action="allowed"),)))
    run = log["runs"][0]
    assert run["results"] == []
    assert run["tool"]["driver"]["rules"] == []
    assert "originalUriBaseIds" not in run
    inv = run["invocations"][0]
    assert inv == {
        "executionSuccessful": True,
        "commandLine": "python setup.py bdist_wheel",
        "exitCode": 0,
        "startTimeUtc": "2023-11-14T22:13:20.000Z",
        "endTimeUtc": "2023-11-14T22:13:22.500Z",
        "properties": {"timedOut": False, "rawExitCode": 0},
    }
    assert run["properties"]["verdict"] == "clean"


def test_sarif_timed_out_and_signal():
    inv = _sarif(make(exit_code=-9, timed_out=True))["runs"][0]["invocations"][0]
    assert inv["exitCode"] == 124
    assert inv["exitSignalNumber"] == 9 and inv["exitSignalName"] == "SIGKILL"
    assert inv["exitCodeDescription"] == "timed out"
    assert inv["properties"] == {"timedOut": True, "rawExitCode": -9}
    inv = _sarif(make(exit_code=-15))["runs"][0]["invocations"][0]
    assert inv["exitCode"] == 143 and inv["exitSignalName"] == "SIGTERM"
    assert "exitCodeDescription" not in inv


def test_sarif_error():
    log = _sarif(make(exit_code=None, error="cannot exec", tool_version="", command=("a b", "c")))
    run = log["runs"][0]
    inv = run["invocations"][0]
    assert inv["executionSuccessful"] is False
    assert "exitCode" not in inv
    assert inv["commandLine"] == "'a b' c"
    assert inv["toolExecutionNotifications"][0]["message"]["text"] == "cannot exec"
    assert "version" not in run["tool"]["driver"]
    assert run["properties"]["verdict"] == "error"


def test_sarif_dropped_and_escaped():
    run = _sarif(make(events=(ev(1, target="/x\x1b[2J"),), events_dropped=4))["runs"][0]
    assert run["properties"]["eventsDropped"] == 4
    res = run["results"][0]
    assert "\x1b" not in res["message"]["text"]
    assert res["properties"]["target"] == "/x\x1b[2J"  # raw evidence kept


def test_install_table_keeps_versions_as_written():
    # tabulate parses "3.10" as the number 3.1 unless told not to
    from pipguard.install.installer import InstallResult, PackageResult
    from pipguard.report.render import install as install_render

    result = InstallResult(("pipguard", "install"), "installed", (),
                           (PackageResult("idna", "3.10", "idna-3.10-py3-none-any.whl", "0" * 64,
                                          True, "clean"),
                            PackageResult("x", "1.0", "x-1.0-py3-none-any.whl", "0" * 64,
                                          False, "clean")), ())
    text = install_render.table(result)
    assert " 3.10 " in text and " 1.0 " in text, text


def test_findings_and_informational_events_are_shown_apart_and_tagged_in_json():
    """Every event says in the JSON whether it counts (``severity``), decided by the rule table;
    the table renderer lists informational ones under their own title, never as "Blocked"."""
    from pipguard.report.render import json as json_render

    events = (ev(1), ev(2, kind="network", target="[::1]:0", rule="loopback-bind"),
              ev(3, action="allowed", target="/tmp/pipguard-x/home/.netrc", rule="config-lookup"),
              ev(4, kind="process", action="allowed", target="cc", rule="exec"))
    report = make(events=events)
    data = json.loads(json_render.render(report))
    assert [e["severity"] for e in data["events"]] == ["finding", "info", "info", "info"]
    assert data["verdict"] == "blocked" and [e.seq for e in report.blocked_events] == [1]
    out = table.render(report)
    blocked, _, rest = out.partition("Informational, not counted (2)")
    assert "Blocked (1)" in blocked and "loopback-bind" not in blocked and ".netrc" not in blocked
    assert "loopback-bind" in rest and "config-lookup" in rest and "exec" not in rest
    assert table.headline(make(events=events[1:])).startswith("pipguard: CLEAN")


# -- markdown ----------------------------------------------------------------
#
# The job summary is read as GitHub renders it: cmark-gfm (GitHub's own
# parser, with its table, autolink, tagfilter and strikethrough extensions) in
# unsafe mode, so any raw HTML a package smuggled through would show up as a
# tag. The HTML is then parsed back into tags and table cells.

from html.parser import HTMLParser  # noqa: E402

from pipguard.install.installer import InstallResult, PackageResult, Phase  # noqa: E402

#: Strings a package controls (its name, a path, a hostname, argv) that try to
#: break out of a table cell or a code span, or inject HTML, links or images.
HOSTILE = (
    "evil|pipe || | --- |",
    "`tick` `` ``` double",
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "</td></tr></table></details><h1>owned</h1>",
    "line1\nline2\r\n| x | y |",
    "[click me](https://evil.example/a) ![img](https://evil.example/i.png)",
    "https://evil.example/raw www.evil.example <https://evil.example/auto>",
    "**bold** _em_ ~~gone~~ # heading > quote",
    "&lt;not-a-tag&gt; &amp; &#60;b&#62;",
    "\x1b[31mred\x1b[0m \u202eevil-right-to-left",
    "trailing backslash \\",
    "<!-- unclosed comment",
    "` leading backtick",
)

#: Tags the summary itself uses; anything else came from a package.
SUMMARY_TAGS = {"h3", "h4", "p", "blockquote", "strong", "code", "table", "thead", "tbody", "tr",
                "th", "td", "ul", "li", "details", "summary", "sub", "br"}


class _Html(HTMLParser):
    """Tags in order, and the text of every table cell, row by row."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list = []
        self.tables: list = []  # [[row cells...]...] per table
        self._cell = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_comment(self, data):
        self.tags.append("!--")


def gfm(text: str) -> _Html:
    cmarkgfm = pytest.importorskip("cmarkgfm")  # in the test extra: CI has it
    from cmarkgfm.cmark import Options

    parsed = _Html()
    parsed.feed(cmarkgfm.github_flavored_markdown_to_html(text, options=Options.CMARK_OPT_UNSAFE))
    return parsed


def install_result(status="refused", packages=(), phases=(), message="", findings=()):
    return InstallResult(("pipguard", "install", "--sandbox", "-r", "requirements.txt"), status,
                         tuple(phases), tuple(packages), tuple(findings), message)


def finding(package="evil", rule="pth-executable", member="evil.pth", line=1, message="executable .pth line",
            evidence="import os; os.system('curl x')", severity="critical"):
    from pipguard.gate.scan import Finding

    return Finding(package, f"{package}-1.0-py3-none-any.whl", severity, rule, member, line, message, evidence)


def refused_result(name="evil", target="/home/u/.ssh/id_rsa", argv0="/usr/bin/python3", host="evil.example:443",
                   gate_evidence="import os; os.system('curl x')"):
    events = (ev(1, target=target, pid=43, rule="secret-read", python="/tmp/b/setup.py:3", seen_by=["audit", "os"]),
              ev(2, "network", target=host, pid=43, rule="no-network"),
              ev(3, "network", target="::1:0", pid=43, rule="loopback-bind"))
    build = make(exit_code=1, events=events, processes=(ProcessRecord(43, 42, (argv0, "setup.py")),),
                 network=(NetworkAttempt("inet", "tcp", "93.184.216.34", 443, "evil.example", "blocked", 43),))
    packages = (PackageResult(name, "1.0", f"{name}-1.0.tar.gz", "ab" * 32, True, "blocked", (),
                              build.blocked_events),
                PackageResult("gated", "2.0", "gated-2.0-py3-none-any.whl", "cd" * 32, False, "gate",
                              (finding("gated", evidence=gate_evidence),)),
                PackageResult("fine", "3.10", "fine-3.10-py3-none-any.whl", "ef" * 32, False, "clean"))
    return install_result("refused", packages, (Phase("build", name, build),),
                          f"refused: blocked attempts while building {name}")


def test_markdown_install_sections_in_order():
    text = markdown.render_result(refused_result())
    first = text.splitlines()[0]
    assert first.startswith("### ❌ pipguard install: REFUSED"), first
    assert "2 blocked attempts" in first and "1 gate finding" in first and "nothing was installed" in first
    order = [text.index(h) for h in ("#### Packages (3)", "#### Gate findings (1)", "#### Blocked attempts (2)",
                                     "#### What to do next", "<details>")]
    assert order == sorted(order)
    html = gfm(text)
    packages, findings, blocked = html.tables[:3]
    assert packages[0] == ["package", "version", "from", "verdict", "gate findings", "blocked", "sha256"]
    assert packages[1:] == [["evil", "1.0", "sdist", "❌ blocked", "0", "2", "abababababab"],
                            ["gated", "2.0", "wheel", "❌ gate", "1", "0", "cdcdcdcdcdcd"],
                            ["fine", "3.10", "wheel", "✅ clean", "0", "0", "efefefefefef"]]
    assert findings[1] == ["gated", "critical", "pth-executable", "evil.pth:1", "executable .pth line",
                           "import os; os.system('curl x')"]
    # the informational loopback probe is not a blocked attempt
    assert blocked[0] == ["kind", "target", "process", "layer", "rule", "python", "phase"]
    assert blocked[1:] == [
        ["file-read", "/home/u/.ssh/id_rsa", "43 (python3)", "audit,os", "secret-read", "/tmp/b/setup.py:3",
         "build of evil"],
        ["network", "evil.example:443", "43 (python3)", "os", "no-network", "—", "build of evil"]]


def test_markdown_next_steps_name_the_package_the_host_and_the_choices():
    text = markdown.render_result(refused_result())
    steps = text.split("#### What to do next", 1)[1].split("<details>", 1)[0]
    assert "**Review**" in steps and "`evil`" in steps
    assert "**Allow a host**" in steps and "`--allow-build-host evil.example:443`" in steps
    assert "::1:0" not in steps  # informational: nothing to allow
    assert "**Approve**" in steps and "sha256" in steps
    assert "**Drop**" in steps


def test_markdown_run_report(blocked_report):
    text = markdown.render(blocked_report)
    assert text.splitlines()[0] == "### ❌ pipguard run: BLOCKED — 2 blocked attempts, exit 1"
    assert "`--allow-host evil.example:443`" in text  # run's flag, not install's
    html = gfm(text)
    blocked = html.tables[0]
    assert [row[1] for row in blocked[1:]] == ["/home/u/.ssh/id_rsa", "evil.example:443"]  # seq order
    assert "phase" not in blocked[0]


def test_markdown_clean_install_and_error():
    clean = install_result("installed", (PackageResult("fine", "1.0", "fine-1.0.tar.gz", "0" * 64, True, "clean"),),
                           message="installed")
    text = markdown.render_result(clean)
    assert text.startswith("### ✅ pipguard install: installed — 1 package\n")
    assert "What to do next" not in text and "evidence, not proof" in text
    error = markdown.render_result(install_result("error", message="pip download failed (exit 1)"))
    assert error.startswith("### ⚠️ pipguard install: ERROR — environment unchanged\n")
    assert "pip download failed \\(exit 1\\)" in error and "could not finish" in error


def test_markdown_renders_saved_reports_and_tolerates_new_fields():
    result = refused_result()
    data = json.loads(json.dumps(result.to_json()))
    assert markdown.from_json(data) == markdown.render_result(result)
    data["events"][0]["severity"] = "info"  # a newer report says per event what counts
    data["future_field"] = {"x": 1}
    data["packages"][0]["hook_calls"] = [{"hook": "build_wheel"}]
    assert "1 blocked attempt," in markdown.from_json(data).splitlines()[0]
    assert markdown.from_json({}).startswith("### ⚠️ pipguard run: ERROR")


@pytest.mark.parametrize("hostile", HOSTILE)
def test_markdown_escapes_hostile_strings(hostile):
    result = refused_result(name=hostile, target=hostile, argv0="/bin/" + hostile, host=hostile,
                            gate_evidence=hostile)
    text = markdown.render_result(result)
    html = gfm(text)
    assert set(html.tags) <= SUMMARY_TAGS, sorted(set(html.tags) - SUMMARY_TAGS)
    assert html.tags.count("h3") == 1 and html.tags.count("details") == 1
    shown = printable(hostile)
    assert "\x1b" not in text and "\u202e" not in text and "\r" not in text
    packages, findings, blocked = html.tables[:3]
    # every row kept its cells: nothing ended a row or added a column
    for table_ in html.tables:
        assert len({len(row) for row in table_}) == 1, table_
    assert len(packages) == 4 and len(blocked) == 3
    # ... and the cells show the value as it is (shortened at most)
    assert packages[1][0] == markdown._shorten(shown, 60)
    assert blocked[1][1] == markdown._shorten(shown, markdown.MAX_CELL)
    assert blocked[1][2] == "43 (" + markdown._shorten(posixpath.basename("/bin/" + shown) or "/bin/" + shown, 40) + ")"
    assert findings[1][5] == markdown._shorten(shown, markdown.MAX_CELL)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_markdown_escapes_hostile_free_text(hostile):
    result = install_result("error", message=hostile)
    html = gfm(markdown.render_result(result))
    assert set(html.tags) <= SUMMARY_TAGS, sorted(set(html.tags) - SUMMARY_TAGS)
    assert "a" not in html.tags and "img" not in html.tags


def test_markdown_code_span_fences():
    assert markdown.code("a`b") == "``a`b``"
    assert markdown.code("``x``") == "``` ``x`` ```"
    assert markdown.code("a|b") == "`a\\|b`" and markdown.code("a|b", cell=False) == "`a|b`"
    assert markdown.code("") == "—"
    assert markdown.text("[x](y)") == "\\[x\\]\\(y\\)"


def test_markdown_tables_are_bounded():
    many = tuple(ev(i, target=f"/secret/{i}") for i in range(1, 80))
    text = markdown.render(make(exit_code=1, events=many))
    blocked = gfm(text).tables[0]
    assert len(blocked) == markdown.MAX_ROWS + 1
    assert "… and 29 more (see the JSON report)" in text


def test_the_combined_report_keeps_the_largest_use_of_each_limit():
    """An install's top-level limits: per limit, the hook call that came closest, named."""
    from pipguard.report.model import combined

    def run(memory_used, hit=None):
        return make(limits={"memory": {"value": 100, "by": "cgroup2", "scope": "run",
                                       "used": {"value": memory_used, "how": "test", "scope": "run"}}},
                    limit_hit=hit)

    both = combined([(run(10), {"phase": "get_requires_for_build_wheel", "package": "a"}),
                     (run(70, "memory"), {"phase": "build_wheel", "package": "a"}),
                     (run(30), {"phase": "build_wheel", "package": "b"})],
                    command=("pipguard",), exit_code=0, isolation="auto", cwd="/", error=None)
    used = both.limits["memory"]["used"]
    assert used["value"] == 70 and used["phase"] == "build_wheel" and used["package"] == "a"
    assert both.limits["memory"]["value"] == 100 and both.limit_hit == "memory"


def test_a_file_left_in_the_namespace_tmp_says_so():
    """A file written in the namespace's own /tmp (gone with it) is marked in the table and
    in Markdown, and keeps its flag through a saved report; a host file is not marked."""
    from pipguard.report.render import DISCARDED
    from pipguard.report.model import from_json

    report = make(files_written=(FileWritten("/tmp/stage.txt", "ab" * 32, 7, discarded=True),
                                 FileWritten("/srv/build/out.o", "cd" * 32, 9)))
    rows = {line.split()[0]: line for line in table.render(report).splitlines() if line.startswith("/")}
    assert rows["/tmp/stage.txt"].rstrip().endswith(DISCARDED), rows
    assert rows["/srv/build/out.o"].rstrip().endswith("yes"), rows
    html = gfm(markdown.render(report))
    files = [t for t in html.tables if "kept" in t[0]][0]
    assert [row[-1] for row in files[1:]] == [DISCARDED, "yes"], files
    assert [f.discarded for f in from_json(report.to_json()).files_written] == [True, False]

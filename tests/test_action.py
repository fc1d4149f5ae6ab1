"""The GitHub Action (``action.yml`` + ``ci/action.py``), run here as GitHub would run it.

``action.yml`` is parsed and its structure checked; then :class:`CompositeRunner` executes its
steps in order the way the Actions runner does (``if:`` conditions, ``${{ }}`` expressions in
``env:``/``with:``, one ``$GITHUB_OUTPUT`` file per step, ``$GITHUB_STEP_SUMMARY``), with real
pipguard against a loopback package index with credentials (:class:`support.LoopbackIndex`).
A ``uses:`` step (the SARIF upload) is recorded with its resolved inputs, not run: nothing here
talks to GitHub. The workflow shown in docs/ci.md is what these tests run: they read it from
the doc and fail when it and the action drift apart.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from support import LoopbackIndex, build_sdist, clean_env
from support.corpus import project
from support.pipinstall import make_venv

yaml = pytest.importorskip("yaml")  # in the test extra: CI has it

REPO = Path(__file__).resolve().parent.parent
ACTION = REPO / "action.yml"
DOC = REPO / "docs" / "ci.md"
#: The line in docs/ci.md right before the workflow these tests run.
DOC_MARKER = "<!-- the workflow tests/test_action.py runs -->"
SCRIPT = "ci/action.py"


def load_action() -> dict:
    return yaml.safe_load(ACTION.read_text())


def doc_workflow() -> dict:
    text = DOC.read_text()
    assert DOC_MARKER in text, f"docs/ci.md lost the marker {DOC_MARKER!r}"
    block = re.search(r"```yaml\n(.*?)```", text.split(DOC_MARKER, 1)[1], re.S)
    assert block, "no ```yaml block after the marker in docs/ci.md"
    return yaml.safe_load(block.group(1))


def doc_action_step(workflow: dict) -> dict:
    (job,) = workflow["jobs"].values()
    steps = [s for s in job["steps"] if str(s.get("uses", "")).split("@")[0].endswith("/pipguard")]
    assert len(steps) == 1, "the doc workflow must use the pipguard action exactly once"
    return steps[0]


# -- a composite-action runner ----------------------------------------------------------------

_EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)
_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||!|\(|\))|(?P<fn>always|success|failure)\(\)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_.-]*))")


@dataclass
class StepResult:
    name: str
    ran: bool
    returncode: int = 0
    outputs: Dict[str, str] = field(default_factory=dict)
    stdout: str = ""
    uses: Optional[str] = None
    with_: Dict[str, str] = field(default_factory=dict)


class CompositeRunner:
    """Runs a composite action's steps as the GitHub runner does, for the subset of the
    expression language ``action.yml`` uses (``inputs.*``, ``steps.*.outputs.*``,
    ``secrets.*``, ``github.action_path``, ``==``, ``!=``, ``&&``, ``||``, ``!``,
    ``always()``/``success()``/``failure()``). Anything else is an error, so the action
    cannot start using an expression this runner would silently get wrong."""

    def __init__(self, action: dict, inputs: Dict[str, str], *, env: Dict[str, str], tmp: Path,
                 step_env: Optional[Dict[str, Dict[str, Optional[str]]]] = None) -> None:
        self.action = action
        declared = action["inputs"]
        unknown = set(inputs) - set(declared)
        assert not unknown, f"inputs the action does not declare: {unknown}"
        self.inputs = {k: str(v.get("default", "")) for k, v in declared.items()}
        self.inputs.update({k: _yaml_string(v) for k, v in inputs.items()})
        self.env = env
        self.step_env = step_env or {}
        self.tmp = tmp
        self.steps: Dict[str, Dict[str, str]] = {}
        self.results: List[StepResult] = []
        self.summary = tmp / "step_summary.md"
        self.failed = False

    def value(self, name: str) -> str:
        parts = name.split(".")
        if parts[0] == "inputs" and len(parts) == 2:
            return self.inputs[parts[1]]
        if parts[0] == "steps" and len(parts) == 4 and parts[2] == "outputs":
            return self.steps.get(parts[1], {}).get(parts[3], "")
        if name == "github.action_path":
            return str(REPO)
        raise AssertionError(f"expression {name!r} is not supported by the test runner")

    def evaluate(self, expr: str):
        pieces, pos = [], 0
        expr = expr.strip()
        while pos < len(expr):
            m = _TOKEN.match(expr, pos)
            assert m and m.end() > pos, f"cannot parse expression {expr!r} at {expr[pos:]!r}"
            pos = m.end()
            if m.group("str"):
                pieces.append(repr(m.group("str")[1:-1].replace("''", "'")))
            elif m.group("op"):
                pieces.append({"&&": " and ", "||": " or ", "!": " not "}.get(m.group("op"), m.group("op")))
            elif m.group("fn"):
                pieces.append({"always": "True", "success": str(not self.failed),
                               "failure": str(self.failed)}[m.group("fn")])
            else:
                pieces.append(repr(self.value(m.group("name"))))
        return eval("".join(pieces), {"__builtins__": {}})  # only literals and operators remain

    def substitute(self, text: str) -> str:
        return _EXPR.sub(lambda m: str(self.evaluate(m.group(1))), str(text))

    def condition(self, step: dict) -> bool:
        cond = step.get("if")
        if cond is None:
            return not self.failed
        cond = str(cond).strip()
        inner = _EXPR.fullmatch(cond)
        result = self.evaluate(inner.group(1) if inner else cond)
        if not re.search(r"always\(\)|failure\(\)", cond):
            result = result and not self.failed  # GitHub adds success() unless a status function is used
        return bool(result)

    def run(self) -> List[StepResult]:
        assert self.action["runs"]["using"] == "composite"
        for i, step in enumerate(self.action["runs"]["steps"]):
            name = step.get("name") or step.get("id") or f"step {i}"
            if not self.condition(step):
                self.results.append(StepResult(name, False))
                continue
            if "uses" in step:
                with_ = {k: self.substitute(v) for k, v in (step.get("with") or {}).items()}
                self.results.append(StepResult(name, True, uses=step["uses"], with_=with_))
                continue
            assert step["shell"] == "bash"
            output = self.tmp / f"output-{i}"
            output.write_text("")
            env = dict(self.env, GITHUB_ACTION_PATH=str(REPO), GITHUB_OUTPUT=str(output),
                       GITHUB_STEP_SUMMARY=str(self.summary), RUNNER_TEMP=str(self.tmp / "runner-temp"))
            for key, extra in self.step_env.get(step.get("id") or "", {}).items():
                if extra is None:
                    env.pop(key, None)
                else:
                    env[key] = extra
            env.update({k: self.substitute(v) for k, v in (step.get("env") or {}).items()})
            (self.tmp / "runner-temp").mkdir(exist_ok=True)
            # as the runner runs `shell: bash`: bash --noprofile --norc -eo pipefail {0}
            script = self.tmp / f"step-{i}.sh"
            script.write_text(step["run"])
            proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                                  cwd=self.env["GITHUB_WORKSPACE"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=900)
            outputs = parse_github_output(output.read_text())
            if step.get("id"):
                self.steps[step["id"]] = outputs
            self.results.append(StepResult(name, True, proc.returncode, outputs, proc.stdout))
            if proc.returncode != 0:
                self.failed = True
        return self.results

    def outputs(self) -> Dict[str, str]:
        return {k: self.substitute(v["value"]) for k, v in self.action["outputs"].items()}


def _yaml_string(value) -> str:
    """An input as GitHub passes it: a string (YAML ``true`` arrives as ``'true'``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_github_output(text: str) -> Dict[str, str]:
    """``$GITHUB_OUTPUT`` as the runner reads it: ``name=value`` lines and
    ``name<<DELIM`` ... ``DELIM`` blocks."""
    out: Dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line:
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            body = []
            while lines[i] != delim:
                body.append(lines[i])
                i += 1
            i += 1
            out[name] = "\n".join(body)
        else:
            name, value = line.split("=", 1)
            out[name] = value
    return out


# -- structure ----------------------------------------------------------------------------------


def test_action_structure():
    action = load_action()
    assert action["runs"]["using"] == "composite"
    assert set(action["inputs"]) == {"requirements", "args", "python", "policy", "fail-on", "sarif"}
    assert action["inputs"]["fail-on"]["default"] == "refused"
    assert action["inputs"]["sarif"]["default"] == "false"
    assert all("description" in v and v.get("required") is False for v in action["inputs"].values())
    assert {"verdict", "report"} <= set(action["outputs"])
    for name, out in action["outputs"].items():
        assert out["value"] == "${{ steps.run.outputs.%s }}" % name
    steps = action["runs"]["steps"]
    run_steps = [s for s in steps if "run" in s]
    for step in run_steps:
        # inputs reach scripts as environment variables: ${{ }} in a script is script injection
        assert "${{" not in step["run"], step["run"]
        assert step["shell"] == "bash"
        called = re.fullmatch(r'''(?:python3|'?"\$PIPGUARD_PYTHON") "\$GITHUB_ACTION_PATH/ci/action\.py" (\w+)'?''',
                              step["run"].strip())
        assert called, step["run"]
        sys.path.insert(0, str(REPO / "ci"))
        try:
            import action as action_script
        finally:
            sys.path.pop(0)
        assert called.group(1) in action_script.STEPS
    assert [s.get("id") for s in steps[:2]] == ["setup", "run"]
    (upload,) = [s for s in steps if "uses" in s]
    # pinned by a full commit SHA: a tag (v3) can be moved to other code (issue 30)
    assert re.fullmatch(r"github/codeql-action/upload-sarif@[0-9a-f]{40}", upload["uses"]), upload["uses"]
    assert upload["with"]["sarif_file"] == "${{ steps.run.outputs.sarif }}"
    assert "inputs.sarif == 'true'" in upload["if"] and "always()" in upload["if"]
    # the gate comes last, after the upload: a refused install still reaches code scanning
    assert steps[-1]["run"].strip().endswith(" gate") and steps.index(upload) < len(steps) - 1
    # the setup step installs the action's own checkout: pipguard is the action's ref
    source = (REPO / SCRIPT).read_text()
    assert '"pip", "install"' in source and "action_path]" in source


def test_doc_workflow_uses_this_action_with_its_inputs():
    workflow = doc_workflow()
    step = doc_action_step(workflow)
    assert set(step.get("with") or {}) <= set(load_action()["inputs"])
    (job,) = workflow["jobs"].values()
    assert workflow["permissions"]["security-events"] == "write"  # the SARIF upload needs it
    assert any(str(s.get("uses", "")).startswith("actions/setup-python@") for s in job["steps"])


# -- running it ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdists(tmp_path_factory):
    out = tmp_path_factory.mktemp("action-sdists")
    for name in ("legit_pure", "steal_at_build"):
        build_sdist(project(name), out)
    return out


@pytest.fixture(scope="module")
def index(wheelhouse, sdists):
    with LoopbackIndex([wheelhouse, sdists]) as idx:
        yield idx


def bootstrap_env() -> Dict[str, Optional[str]]:
    """What the setup step's pip sees beyond the job's environment. On a runner it
    installs pipguard's dependencies from PyPI; here, from this machine's own pip
    configuration (its ``PIP_*`` variables and config files), and only in this step."""
    extra: Dict[str, Optional[str]] = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    extra.setdefault("PIP_CONFIG_FILE", None)  # None: not /dev/null; read the machine's config files
    # The doc's private index would serve pipguard's dependencies on a runner; the loopback
    # index serves only the test's packages, so here this machine's sources stand in for it.
    extra.setdefault("PIP_INDEX_URL", None)
    return extra


def doc_expression(value: object, secrets: Dict[str, str]) -> str:
    """A workflow-level value of the doc's step, with ``${{ secrets.NAME }}`` filled in."""
    def sub(m):
        expr = m.group(1).strip()
        assert expr.startswith("secrets."), f"the doc step uses {expr!r}; the test only provides secrets"
        return secrets[expr[len("secrets."):]]
    return _EXPR.sub(sub, _yaml_string(value))


def run_action(tmp: Path, home, with_: Dict[str, object], *, requirements: str, wheelhouse: Path,
               env: Optional[Dict[str, str]] = None) -> CompositeRunner:
    """Run action.yml with the inputs ``with_`` and the step environment ``env`` in a fresh
    workspace (holding ``requirements.txt``) whose PATH starts with a fresh target venv."""
    workspace = tmp / "workspace"
    workspace.mkdir()
    (workspace / "requirements.txt").write_text(requirements)
    target = make_venv(tmp / "target", "bundled", wheelhouse)  # `python -m venv`'s, made faster
    # actions/setup-python puts the job's interpreter first on PATH; so does this
    job_env = clean_env(home.path, {"GITHUB_WORKSPACE": str(workspace),
                                    "PATH": f"{target / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    job_env.update(env or {})
    runner = CompositeRunner(load_action(), with_, env=job_env, tmp=tmp, step_env={"setup": bootstrap_env()})
    runner.target = target  # type: ignore[attr-defined]
    runner.run()
    return runner


def installed(target: Path, module: str) -> bool:
    # from inside the venv: the test's own working directory (the checkout) would shadow it
    return subprocess.run([str(target / "bin" / "python"), "-c", f"import {module}"], cwd=target,
                          capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def home_module(tmp_path_factory):
    from support import make_fake_home, remove_fake_home

    home = make_fake_home()
    yield home
    remove_fake_home(home)


@pytest.fixture(scope="module")
def doc_run(tmp_path_factory, home_module, index, wheelhouse):
    """The workflow of docs/ci.md, its secret pointing at the loopback index."""
    step = doc_action_step(doc_workflow())
    secrets = {"PIP_INDEX_URL": index.url}
    with_ = {k: doc_expression(v, secrets) for k, v in (step.get("with") or {}).items()}
    env = {k: doc_expression(v, secrets) for k, v in (step.get("env") or {}).items()}
    tmp = tmp_path_factory.mktemp("action-doc")
    return run_action(tmp, home_module, with_, requirements="legit_pure\n", env=env, wheelhouse=wheelhouse)


def test_doc_workflow_installs_and_reports(doc_run, index):
    results = {r.name: r for r in doc_run.results}
    assert all(r.returncode == 0 for r in doc_run.results), [(r.name, r.stdout[-3000:]) for r in doc_run.results]
    out = doc_run.outputs()
    assert out["verdict"] == "clean" and out["status"] == "installed" and out["exit-code"] == "0", out
    assert installed(doc_run.target, "legit_pure")
    report = json.loads(Path(out["report"]).read_text())
    assert report["status"] == "installed" and [p["name"] for p in report["packages"]] == ["legit-pure"]
    summary = doc_run.summary.read_text()
    assert summary.startswith("### ✅ pipguard install: installed — 1 package\n"), summary[:300]
    assert "`legit-pure`" in summary
    # the pipguard that ran is the action's checkout, in its own venv (not the target's)
    assert not installed(doc_run.target, "pipguard")
    assert "pipguard, version" in results[doc_run.results[0].name].stdout
    # the index was used through its credentials, which stay out of the summary and outputs
    assert any(ok for _m, _p, ok in index.requests)
    assert index.token not in summary and all(index.token not in v for v in out.values())


# pip's own messages must not reach pipguard's stdout when a report format is printed there
# (DESIGN.md "CLI contract"): with pip's output mixed in, the action would see no SARIF.
def test_doc_workflow_uploads_its_sarif(doc_run):
    # the doc asks for SARIF: the upload step got the file pipguard wrote
    out = doc_run.outputs()
    (upload,) = [r for r in doc_run.results if r.name.startswith("Upload SARIF")]
    assert upload.ran and upload.with_["sarif_file"] == out["sarif"]
    sarif = json.loads(Path(out["sarif"]).read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"] == []


def test_doc_workflow_never_uploads_what_is_not_sarif(doc_run):
    run = doc_run.results[1]
    if doc_run.steps["run"]["sarif"] == "":
        assert "::warning::pipguard's standard output was not SARIF: nothing to upload" in run.stdout
        assert not doc_run.results[2].ran
    else:
        assert json.loads(Path(doc_run.steps["run"]["sarif"]).read_text())["version"] == "2.1.0"


@pytest.fixture(scope="module")
def refused_run(tmp_path_factory, home_module, index, wheelhouse):
    tmp = tmp_path_factory.mktemp("action-refused")
    return run_action(tmp, home_module, {"requirements": "requirements.txt", "args": f"--index-url '{index.url}'",
                                         "sarif": True}, requirements="steal_at_build\nlegit_pure\n",
                      wheelhouse=wheelhouse)


def test_refused_install_fails_the_job_after_the_upload(refused_run, home_module):
    by_name = [(r.name, r.ran, r.returncode) for r in refused_run.results]
    setup, run, _upload, gate = refused_run.results
    assert setup.returncode == 0 and run.returncode == 0, by_name
    out = refused_run.outputs()
    assert out["verdict"] == "blocked" and out["status"] == "refused" and out["exit-code"] == "1", out
    assert not installed(refused_run.target, "steal_at_build") and not installed(refused_run.target, "legit_pure")
    assert gate.ran and gate.returncode == 1
    assert "::error title=pipguard::pipguard refused the install; verdict blocked" in gate.stdout
    summary = refused_run.summary.read_text()
    assert summary.startswith("### ❌ pipguard install: REFUSED"), summary[:300]
    assert "#### Blocked attempts" in summary and "`secret-read`" in summary and "`steal-at-build`" in summary
    assert "#### What to do next" in summary
    # the job summary is the summary file the step names, and the log shows it too
    assert Path(run.outputs["summary"]).read_text() == summary
    assert "::group::pipguard summary" in run.stdout
    # every output the run step sets is one the action declares (``summary`` was not: a
    # workflow's ``steps.pipguard.outputs.summary`` was empty)
    assert set(run.outputs) - {"python", "target-python"} <= set(load_action()["outputs"]), run.outputs
    assert out["summary"] == run.outputs["summary"]


def test_refused_summary_shows_the_sdists_sha256_and_how_to_approve(refused_run):
    """A package refused in its build has no wheel: its row showed sha256 ``—``; it shows
    the sdist's (what an approval is pinned to), and "what to do next" says how to approve."""
    out = refused_run.outputs()
    report = json.loads(Path(out["report"]).read_text())
    (refusal,) = [r for r in report["refusals"] if r["package"] == "steal-at-build"]
    digest = refusal["origin"]["sha256"]
    assert re.fullmatch(r"[0-9a-f]{64}", digest), refusal
    summary = refused_run.summary.read_text()
    (row,) = [line for line in summary.splitlines() if line.startswith("| `steal-at-build`")]
    assert row.rstrip().endswith(f"| `{digest[:12]}` |"), row
    assert "| — |" not in row
    steps = summary.split("#### What to do next", 1)[1]
    assert "pipguard approve --from-report" in steps and "`steal-at-build`" in steps, steps


def test_refused_install_still_uploads_its_sarif(refused_run):
    # uploaded even though the job fails: the gate comes after the upload
    out = refused_run.outputs()
    upload = refused_run.results[2]
    assert upload.ran and upload.with_["sarif_file"] == out["sarif"]
    results = json.loads(Path(out["sarif"]).read_text())["runs"][0]["results"]
    assert results and all(r["ruleId"] for r in results)


def run_gate(fail_on: str, exit_code: str) -> subprocess.CompletedProcess:
    env = dict(clean_env(), INPUT_FAIL_ON=fail_on, PIPGUARD_EXIT_CODE=exit_code, PIPGUARD_VERDICT="x")
    return subprocess.run([sys.executable, str(REPO / SCRIPT), "gate"], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("fail_on, exit_code, fails", [
    ("refused", "0", False), ("refused", "1", True), ("refused", "2", True), ("refused", "130", True),
    ("refused", "143", True), ("error", "143", True),
    ("error", "0", False), ("error", "1", False), ("error", "2", True), ("error", "", True),
    ("never", "1", False), ("never", "2", False),
])
def test_gate_follows_fail_on(fail_on, exit_code, fails):
    proc = run_gate(fail_on, exit_code)
    assert proc.returncode == (1 if fails else 0), proc.stdout
    if exit_code != "0":
        assert ("::error" if fails else "::warning") in proc.stdout


def test_bad_inputs_fail_in_one_line(tmp_path):
    env = dict(clean_env(), INPUT_FAIL_ON="sometimes", GITHUB_OUTPUT=str(tmp_path / "out"),
               RUNNER_TEMP=str(tmp_path))
    proc = subprocess.run([sys.executable, str(REPO / SCRIPT), "run"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout.startswith("::error title=pipguard action::fail-on: 'sometimes'")
    env.update(INPUT_FAIL_ON="refused", INPUT_REQUIREMENTS="missing.txt")
    proc = subprocess.run([sys.executable, str(REPO / SCRIPT), "run"], env=env, capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 2 and "requirements file not found: missing.txt" in proc.stdout


def test_args_are_split_as_words_and_never_run(tmp_path):
    sys.path.insert(0, str(REPO / "ci"))
    try:
        import action as script
    finally:
        sys.path.pop(0)
    (tmp_path / "r.txt").write_text("x\n")
    os.chdir(tmp_path)
    argv = script.pipguard_argv({"INPUT_REQUIREMENTS": "r.txt\n r.txt", "INPUT_ARGS": "'a b' $(touch pwned) --pre",
                                 "PIPGUARD_TARGET_PYTHON": "/usr/bin/python3"}, "/tmp/r.json")
    assert argv[3:] == ["install", "--sandbox", "--report", "/tmp/r.json", "--format", "sarif",
                        "--python", "/usr/bin/python3", "-r", "r.txt", "-r", "r.txt", "a b", "$(touch", "pwned)", "--pre"]
    assert not (tmp_path / "pwned").exists()


def test_outputs_cannot_be_forged(tmp_path):
    sys.path.insert(0, str(REPO / "ci"))
    try:
        import action as script
    finally:
        sys.path.pop(0)
    out = tmp_path / "out"
    os.environ["GITHUB_OUTPUT"] = str(out)
    try:
        script.set_output("verdict", "clean\nverdict=forged\nEOF")
    finally:
        del os.environ["GITHUB_OUTPUT"]
    assert parse_github_output(out.read_text()) == {"verdict": "clean\nverdict=forged\nEOF"}

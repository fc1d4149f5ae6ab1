"""The steps of the pipguard GitHub Action (``action.yml``), one subcommand each.

``action.yml`` holds no logic of its own: every ``run:`` step is
``python ci/action.py STEP`` with the action's inputs in ``INPUT_*``
environment variables (never ``${{ }}`` inside a script: an input is data,
not shell code). Everything a step reports goes where GitHub reads it:
``$GITHUB_OUTPUT`` (step outputs), ``$GITHUB_STEP_SUMMARY`` (the job summary),
workflow commands on stdout (``::error::``). tests/test_action.py runs these
steps with a fake ``GITHUB_*`` environment.

  setup  (any python3, stdlib only)  make a private venv, install pipguard from
         the action's own checkout into it (so the version is the action's ref
         and the target environment gets none of pipguard's dependencies)
  run    (that venv's python)         pipguard install --sandbox with the inputs;
         write the JSON report, the SARIF file and the Markdown summary; set the
         outputs; never fail (the gate step decides, after the SARIF upload)
  gate   (any python3)                 fail the job as ``fail-on`` says
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from typing import Dict, List, Optional

#: pipguard's exit statuses (pipguard/exitcodes.py; DESIGN.md "CLI contract")
OK, REFUSED, ERROR = 0, 1, 2
FAIL_ON = ("refused", "error", "never")


class ActionError(Exception):
    """A bad input or a broken runner: shown as one ``::error::`` line."""


# -- GitHub's files -----------------------------------------------------------


def set_output(name: str, value: str) -> None:
    """Append one step output to ``$GITHUB_OUTPUT`` (heredoc form with a random
    delimiter: a value cannot forge another output)."""
    path = os.environ.get("GITHUB_OUTPUT")
    if not path:
        print(f"{name}={value}")
        return
    delimiter = f"pipguard_{uuid.uuid4().hex}"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")


def append_summary(markdown: str) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(markdown if markdown.endswith("\n") else markdown + "\n")


def command_text(text: str) -> str:
    """Escape a workflow command's message (GitHub's own rules: %, CR, LF)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def workdir() -> str:
    path = os.path.join(os.environ.get("RUNNER_TEMP") or "/tmp", "pipguard")
    os.makedirs(path, exist_ok=True)
    return path


# -- setup --------------------------------------------------------------------


def setup() -> int:
    """Create ``$RUNNER_TEMP/pipguard/venv`` and install the action's checkout
    into it; output ``python`` (that venv's interpreter) and ``target-python``
    (the interpreter that receives the packages)."""
    action_path = os.environ.get("GITHUB_ACTION_PATH") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = target_python(os.environ.get("INPUT_PYTHON", ""))
    venv = os.path.join(workdir(), "venv")
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", action_path], check=True)
    subprocess.run([python, "-m", "pipguard", "--version"], check=True)
    set_output("python", python)
    set_output("target-python", target)
    return 0


def target_python(given: str) -> str:
    """The ``python`` input as an absolute path; empty: the first ``python3``
    (else ``python``) on PATH, as a later ``pip install`` step would use."""
    name = given.strip()
    found = shutil.which(name) if name else (shutil.which("python3") or shutil.which("python"))
    if not found:
        raise ActionError(f"python interpreter not found: {name or 'python3 on PATH'}")
    return os.path.abspath(found)


# -- run ----------------------------------------------------------------------


def pipguard_argv(env: Dict[str, str], report: str) -> List[str]:
    """The ``pipguard install --sandbox`` command line for the inputs in ``env``.

    ``requirements``: files, separated by whitespace or newlines, each passed as
    ``-r FILE``. ``args``: more pip arguments, split as a POSIX shell splits
    words (quotes work; nothing is expanded). Only arguments plain pip has are
    added here (``-r``), so the action keeps working whatever pip options
    pipguard learns.
    """
    argv = [sys.executable, "-m", "pipguard", "install", "--sandbox", "--report", report, "--format", "sarif"]
    target = env.get("PIPGUARD_TARGET_PYTHON", "")
    if target:
        argv += ["--python", target]
    policy = env.get("INPUT_POLICY", "").strip()
    if policy:
        if not os.path.isfile(policy):
            raise ActionError(f"policy file not found: {policy}")
        if not supports_option("--policy"):
            raise ActionError("this pipguard has no policy files yet (--policy): leave the 'policy' input empty")
        argv += ["--policy", policy]
    for path in env.get("INPUT_REQUIREMENTS", "").split():
        if not os.path.isfile(path):
            raise ActionError(f"requirements file not found: {path}")
        argv += ["-r", path]
    try:
        argv += shlex.split(env.get("INPUT_ARGS", ""))
    except ValueError as exc:
        raise ActionError(f"args: {exc}") from None
    return argv


def supports_option(option: str) -> bool:
    proc = subprocess.run([sys.executable, "-m", "pipguard", "install", "--help"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    return option in proc.stdout.split()


def run() -> int:
    env = dict(os.environ)
    fail_on(env)  # a bad gate input fails now, before minutes of building
    out = workdir()
    report, sarif, summary = (os.path.join(out, n) for n in ("report.json", "report.sarif", "summary.md"))
    for stale in (report, sarif, summary):
        if os.path.exists(stale):
            os.unlink(stale)
    argv = pipguard_argv(env, report)
    print("pipguard:", " ".join(shlex.quote(a) for a in argv[1:]), flush=True)
    with open(sarif, "wb") as stdout:
        code = subprocess.run(argv, stdout=stdout).returncode  # pip's and pipguard's stderr: the job log

    data = _load(report)
    if not _is_sarif(sarif):
        # --format sarif puts SARIF and only SARIF on stdout; anything else is shown, not uploaded.
        with open(sarif, encoding="utf-8", errors="replace") as fh:
            sys.stdout.write(fh.read())
        print("::warning::pipguard's standard output was not SARIF: nothing to upload")
        os.unlink(sarif)
        sarif = ""
    if data is not None:
        from pipguard.report.render.markdown import from_json

        markdown = from_json(data)
        verdict = str(data.get("verdict") or "error")
    else:
        markdown = (f"### ⚠️ pipguard install: ERROR — exit {code}\n\n"
                    "pipguard stopped before it wrote a report: its message is in the job log.\n")
        verdict = "error"
    with open(summary, "w", encoding="utf-8") as fh:
        fh.write(markdown)
    append_summary(markdown)
    print("::group::pipguard summary (Markdown, also in the job summary)")
    print(markdown, end="")
    print("::endgroup::", flush=True)

    set_output("verdict", verdict)
    set_output("status", str(data.get("status") or verdict) if data is not None else "error")
    set_output("exit-code", str(code))
    set_output("report", report if data is not None else "")
    set_output("sarif", sarif)
    set_output("summary", summary)
    return 0


def _load(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_sarif(path: str) -> bool:
    data = _load(path)
    return data is not None and data.get("version") == "2.1.0" and isinstance(data.get("runs"), list)


# -- gate ---------------------------------------------------------------------


def fail_on(env: Dict[str, str]) -> str:
    value = env.get("INPUT_FAIL_ON", "refused").strip() or "refused"
    if value not in FAIL_ON:
        raise ActionError(f"fail-on: {value!r} is not one of {', '.join(FAIL_ON)}")
    return value


def gate() -> int:
    """Exit 1 when ``fail-on`` says this outcome fails the job:
    ``refused`` fails on a refusal and on an error, ``error`` only on an error
    (a refusal is then a finding to read, not a failure), ``never`` never."""
    env = dict(os.environ)
    policy = fail_on(env)
    raw = env.get("PIPGUARD_EXIT_CODE", "")
    code = int(raw) if raw.strip().lstrip("-").isdigit() else ERROR  # no exit code: the run step broke
    verdict = env.get("PIPGUARD_VERDICT", "") or "error"
    if code == OK:
        return 0
    failing = {"refused": True, "error": code != REFUSED, "never": False}[policy]
    what = "refused the install" if code == REFUSED else f"could not finish (exit {code})"
    message = f"pipguard {what}; verdict {verdict}. See the job summary."
    if failing:
        print(f"::error title=pipguard::{command_text(message)}")
        return 1
    print(f"::warning title=pipguard::{command_text(message)} (fail-on: {policy})")
    return 0


STEPS = {"setup": setup, "run": run, "gate": gate}


def main(args: List[str]) -> int:
    if len(args) != 1 or args[0] not in STEPS:
        print(f"usage: {os.path.basename(sys.argv[0])} {'|'.join(STEPS)}", file=sys.stderr)
        return 2
    try:
        return STEPS[args[0]]()
    except ActionError as exc:
        print(f"::error title=pipguard action::{command_text(str(exc))}")
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"::error title=pipguard action::{command_text(f'{exc.cmd[0]} failed with exit {exc.returncode}')}")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

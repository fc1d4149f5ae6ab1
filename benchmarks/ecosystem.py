#!/usr/bin/env python3
"""The ecosystem sweep: do real sdists install under ``pipguard install --sandbox`` exactly
as under plain pip, with no refusal? (issue 29; results in docs/performance.md)

Each row is one real sdist forced from source (``--no-binary NAME``; its dependencies and
build requirements come from PyPI as pip picks them), or a PEP 660 editable install of a small
project written here, one per backend. Per row, two installs with the same pip arguments into
fresh copies of one venv:

    plain     VENV/bin/python -m pip install ARGS
    pipguard  pipguard install --sandbox --python VENV/bin/python [--isolation I] ARGS

with the machine's pip configuration neutralised (``PIP_CONFIG_FILE=/dev/null``, every
``PIP_*`` variable dropped: benchmarks/bench.py's ``clean_env``) and bytecode caching on, as a
user has it; the two run one after the other, alternating which goes first row by row. A row
**matches** when both exit 0, ``pip list --format=freeze`` is the same set,
the row's modules import, (editables) an edit to the source shows through on the next import,
and pipguard's report has no finding (nothing above informational); when plain pip fails too
the row is "pip fails" (not pipguard's to fix). Anything else is a mismatch, with its cause:
pipguard's refusals and findings, or its exit status and the end of its log.

The sdists are fetched once into ``--cache`` (default ``~/.cache/pipguard-bench/ecosystem``,
beside bench.py's cache): the newest sdist of each name at the first fetch, unless pinned
below; later runs reuse what is there (the versions are in the output).

Output: progress lines on stderr as rows finish (CI logs), a Markdown table on stdout, and
both the table and the JSON of every row in ``--out`` (default benchmarks/runs/,
``ecosystem-DATE-COMMIT.{md,json}``). ``--jobs`` rows at once (default 1: timings on a shared
2-CPU machine are noisy enough). Timing is reported, never asserted: this is a sweep, not a
test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (Bench, clean_env, compile_pipguard, default_pipguard, git_state,  # noqa: E402
                   log, machine_facts, pip_download, timed)


@dataclass(frozen=True)
class Row:
    """One row: ``name`` an sdist from PyPI (``version`` pinned or None: the cached one), or
    with ``editable`` a project of that backend written here and installed with ``-e``.
    ``modules``: what must import afterwards."""

    name: str
    backend: str
    kind: str
    modules: Tuple[str, ...]
    version: Optional[str] = None
    editable: bool = False

    @property
    def id(self) -> str:
        return f"editable-{self.name}" if self.editable else self.name


def _sdist(name: str, backend: str, kind: str, *modules: str, version: Optional[str] = None) -> Row:
    return Row(name, backend, kind, modules or (name.replace("-", "_"),), version)


SDISTS = (
    # setuptools, pure Python
    _sdist("six", "setuptools", "pure"),
    _sdist("pycparser", "setuptools", "pure"),
    _sdist("certifi", "setuptools", "pure"),
    # setuptools with C extensions
    _sdist("markupsafe", "setuptools", "C ext", "markupsafe._speedups"),
    _sdist("simplejson", "setuptools", "C ext", "simplejson._speedups"),
    _sdist("wrapt", "setuptools", "C ext", "wrapt"),
    _sdist("psutil", "setuptools", "C ext", "psutil._psutil_linux"),
    _sdist("zope.interface", "setuptools", "C ext", "zope.interface"),
    _sdist("multidict", "setuptools", "C ext", "multidict"),
    # Cython
    _sdist("pyyaml", "setuptools + Cython", "Cython", "yaml"),
    _sdist("msgpack", "setuptools + Cython", "Cython/C++", "msgpack"),
    _sdist("frozenlist", "in-tree backend over setuptools + Cython", "Cython", "frozenlist"),
    _sdist("yarl", "in-tree backend over setuptools + Cython", "Cython", "yarl"),
    _sdist("propcache", "in-tree backend over setuptools + Cython", "Cython", "propcache"),
    # setuptools-scm users (its walk up the parents of the build tree: issue 29)
    _sdist("setuptools-scm", "setuptools + setuptools-scm (itself)", "pure", "setuptools_scm"),
    _sdist("pluggy", "setuptools + setuptools-scm", "pure"),
    _sdist("ujson", "setuptools + setuptools-scm", "C ext", version="5.10.0"),
    _sdist("pytest-xdist", "setuptools + setuptools-scm", "pure", "xdist"),
    _sdist("python-dateutil", "setuptools + setuptools-scm", "pure", "dateutil"),
    # hatchling (+ hatch-vcs)
    _sdist("hatchling", "hatchling (itself)", "pure"),
    _sdist("iniconfig", "hatchling + hatch-vcs", "pure"),
    _sdist("termcolor", "hatchling + hatch-vcs", "pure"),
    _sdist("attrs", "hatchling + hatch-vcs + fancy-pypi-readme", "pure", "attrs"),
    _sdist("hatch-vcs", "hatchling + hatch-vcs (itself)", "pure", "hatch_vcs"),
    _sdist("referencing", "hatchling + hatch-vcs", "pure"),
    _sdist("urllib3", "hatchling + hatch-vcs", "pure"),
    _sdist("execnet", "hatchling + hatch-vcs", "pure"),
    # flit-core
    _sdist("flit-core", "flit-core (itself)", "pure"),
    _sdist("idna", "flit-core", "pure"),
    _sdist("packaging", "flit-core", "pure"),
    _sdist("tomli", "flit-core", "pure"),
    _sdist("typing-extensions", "flit-core", "pure", "typing_extensions"),
    _sdist("wheel", "flit-core", "pure"),
    # pdm-backend
    _sdist("pdm-backend", "pdm-backend (itself)", "pure", "pdm.backend"),
    _sdist("unearth", "pdm-backend", "pure"),
    # poetry-core
    _sdist("poetry-core", "poetry-core (itself)", "pure", "poetry.core"),
    _sdist("tomlkit", "poetry-core", "pure"),
    # meson-python, scikit-build-core
    _sdist("meson-python", "meson-python (itself)", "pure", "mesonpy"),
    _sdist("scikit-build-core", "hatchling + hatch-vcs", "pure", "scikit_build_core"),
    _sdist("pybind11", "scikit-build-core + CMake", "C++ headers", "pybind11"),
)

#: PEP 660 editables: backend name -> its [build-system] table and any tool table
EDITABLE_BACKENDS: Dict[str, Tuple[str, str]] = {
    "setuptools": ('requires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"', ""),
    "hatchling": ('requires = ["hatchling"]\nbuild-backend = "hatchling.build"', ""),
    "flit-core": ('requires = ["flit_core>=3.4"]\nbuild-backend = "flit_core.buildapi"', ""),
    "pdm-backend": ('requires = ["pdm-backend"]\nbuild-backend = "pdm.backend"', ""),
    "poetry-core": ('requires = ["poetry-core>=2"]\nbuild-backend = "poetry.core.masonry.api"',
                    '[tool.poetry]\npackages = [{include = "MODULE"}]\n'),
}
EDITABLES = tuple(Row(b, b, "editable", (f"pgedit_{b.replace('-', '_')}",), editable=True)
                  for b in EDITABLE_BACKENDS)
ROWS = SDISTS + EDITABLES


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------- the cache


def cached_sdist(dist: str, row: Row) -> Optional[Tuple[str, str]]:
    """(path, version) of the cached sdist of ``row``: its pin, else the newest there."""
    found = []
    for entry in os.listdir(dist):
        if not entry.endswith(".tar.gz"):
            continue
        stem = entry[:-len(".tar.gz")]
        name, sep, version = stem.rpartition("-")
        if sep and canonical(name) == canonical(row.name) and (row.version in (None, version)):
            found.append((os.path.getmtime(os.path.join(dist, entry)), version, entry))
    if not found:
        return None
    _, version, entry = max(found)
    return os.path.join(dist, entry), version


def fetch(cache: str, rows: Sequence[Row], python: str) -> str:
    """Fill ``cache`` once with the sdists of ``rows`` (one ``pip download`` for all that are
    missing: bench.py's helper, pip's configuration neutralised); return its path."""
    os.makedirs(cache, exist_ok=True)
    missing = [r for r in rows if not r.editable and cached_sdist(cache, r) is None]
    for r in missing:  # one at a time: --no-binary reaches build requirements (hatchling's)
        try:
            pip_download(python, ["--no-deps", "--no-binary", r.name,
                                  f"{r.name}=={r.version}" if r.version else r.name], cache)
        except subprocess.CalledProcessError:  # pip prepares metadata: its build can fail
            log(f"ecosystem: {r.name}: plain pip download failed (above)")
    absent = [r.name for r in rows if not r.editable and cached_sdist(cache, r) is None]
    if absent:
        raise SystemExit(f"ecosystem: no sdist in {cache} for {', '.join(absent)}")
    return cache


# ----------------------------------------------------------------------------- one row

EDIT_CHECK = "import importlib, sys; m = importlib.import_module(sys.argv[1]); print(m.VALUE)"


def write_editable(root: str, row: Row) -> str:
    """A small project of ``row``'s backend in ``root``: one package whose VALUE is 1."""
    module = row.modules[0]
    build, tool = EDITABLE_BACKENDS[row.backend]
    project = os.path.join(root, "project")
    os.makedirs(os.path.join(project, module))
    with open(os.path.join(project, "pyproject.toml"), "w") as fh:
        fh.write(f"[build-system]\n{build}\n\n[project]\nname = \"{module}\"\nversion = \"0.1.0\"\n"
                 f"description = \"pipguard's editable probe\"\n\n{tool.replace('MODULE', module)}")
    with open(os.path.join(project, module, "__init__.py"), "w") as fh:
        fh.write('"""pipguard\'s editable probe."""\n__version__ = "0.1.0"\nVALUE = 1\n')
    return project


def edit_shows(python: str, project: str, row: Row, env: Dict[str, str], cwd: str) -> str:
    """"" when VALUE reads 1, then 2 after editing the source; else what went wrong."""
    module = row.modules[0]

    def value() -> str:
        ran = subprocess.run([python, "-c", EDIT_CHECK, module], capture_output=True, text=True,
                             env=env, cwd=cwd, timeout=120)
        return ran.stdout.strip() if ran.returncode == 0 else "error: " + _tail(ran.stderr, 1)

    before = value()
    path = os.path.join(project, module, "__init__.py")
    with open(path) as fh:
        text = fh.read()
    with open(path, "w") as fh:
        fh.write(text.replace("VALUE = 1", "VALUE = 2"))
    after = value()
    return "" if (before, after) == ("1", "2") else f"edit did not show through ({before} -> {after})"


def _tail(text: str, lines: int) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) if kept else "?"


@dataclass
class Install:
    """One install of a row: exit status, seconds, what got installed, what failed."""

    variant: str
    rc: int
    seconds: float
    freeze: List[str] = field(default_factory=list)
    problem: str = ""  # import or edit failure
    findings: List[str] = field(default_factory=list)  # "rule target" above informational
    refusals: List[str] = field(default_factory=list)
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.problem


@dataclass
class Result:
    row: str
    backend: str
    kind: str
    version: str
    plain: Install
    pipguard: Install
    verdict: str = ""  # match / pip fails / mismatch
    cause: str = ""

    @property
    def ratio(self) -> Optional[float]:
        if self.plain.ok and self.pipguard.ok and self.plain.seconds > 0:
            return self.pipguard.seconds / self.plain.seconds
        return None


class Sweep:
    def __init__(self, args, cache: str, pipguard: List[str]) -> None:
        self.args = args
        self.cache = cache
        self.pipguard = pipguard
        self.bench = Bench(args, cache, pipguard)  # fresh venvs from one template, clean env

    def pip_args(self, row: Row, project: str = "") -> Tuple[List[str], str]:
        if row.editable:
            return ["install", "--no-cache-dir", "-e", project], "0.1.0"
        found = cached_sdist(self.cache, row)
        assert found is not None
        _, version = found
        return ["install", "--no-cache-dir", "--find-links", self.cache, "--no-binary", row.name,
                f"{row.name}=={version}"], version

    def install(self, row: Row, variant: str) -> Tuple[Install, str]:
        venv, work = self.bench.fresh(f"{row.id}-{variant}")
        python = os.path.join(venv, "bin", "python")
        project = write_editable(os.path.dirname(work), row) if row.editable else ""
        args, version = self.pip_args(row, project)
        logfile = os.path.join(os.path.dirname(work), "log.txt")
        report_path = os.path.join(os.path.dirname(work), "report.json")
        if variant == "plain":
            cmd = [python, "-m", "pip", *args]
        else:
            cmd = [*self.pipguard, "install", "--sandbox", "--python", python, "--report",
                   report_path, *self.args.pipguard_args, *args[1:]]
        rc, seconds = timed(cmd, work, logfile, self.bench.env, timeout=self.args.timeout)
        result = Install(variant, rc, round(seconds, 3))
        if os.path.exists(report_path):
            try:
                with open(report_path) as fh:
                    report = json.load(fh)
                result.findings = [f"{e.get('rule')} {e.get('target')}" for e in report.get("events", ())
                                   if e.get("severity") == "finding"]
                result.refusals = [str(r.get("message", r)) if isinstance(r, dict) else str(r)
                                   for r in report.get("refusals") or ()]
            except (OSError, ValueError) as exc:
                result.problem = f"unreadable report: {exc}"
        if rc == 0:
            freeze = subprocess.run([python, "-m", "pip", "list", "--format=freeze"],
                                    capture_output=True, text=True, env=self.bench.env, cwd=work)
            result.freeze = sorted(line for line in freeze.stdout.splitlines() if line.strip())
            for module in row.modules:
                ran = subprocess.run([python, "-c", f"import {module}"], capture_output=True,
                                     text=True, env=self.bench.env, cwd=work)
                if ran.returncode != 0:
                    result.problem = f"import {module} failed: {_tail(ran.stderr, 1)}"
                    break
            if row.editable and not result.problem:
                result.problem = edit_shows(python, project, row, self.bench.env, work)
        if not result.ok:
            with open(logfile, errors="replace") as fh:
                result.log_tail = _tail(fh.read(), 3)[-600:]
        if not self.args.keep_work and (result.ok or variant == "plain"):
            shutil.rmtree(os.path.dirname(work), ignore_errors=True)
        elif not result.ok:
            log(f"  {row.id} {variant}: log kept in {logfile}")
        return result, version

    def row(self, row: Row) -> Result:
        # alternate which goes first: the first install of a row fetches the build requirements
        # through whatever caches sit on the way (this machine's TLS proxy), the second gains
        if ROWS.index(row) % 2:
            guarded, version = self.install(row, "pipguard")
            plain, _ = self.install(row, "plain")
        else:
            plain, version = self.install(row, "plain")
            guarded, _ = self.install(row, "pipguard")
        result = Result(row.id, row.backend, row.kind, version, plain, guarded)
        result.verdict, result.cause = judge(plain, guarded)
        ratio = f"{result.ratio:.2f}" if result.ratio else "-"
        log(f"ecosystem: {row.id:24s} {version:12s} {result.verdict:9s} plain {plain.seconds:6.1f} s "
            f"pipguard {guarded.seconds:6.1f} s ratio {ratio}" + (f"  ({result.cause})" if result.cause else ""))
        return result


def judge(plain: Install, guarded: Install) -> Tuple[str, str]:
    """(verdict, cause) of one row."""
    if not plain.ok:
        cause = plain.problem or f"pip exit {plain.rc}: {plain.log_tail}"
        if guarded.ok or guarded.findings:
            return "mismatch", f"plain pip failed ({cause}), pipguard did not fail the same way"
        return "pip fails", cause
    causes = []
    if guarded.refusals:
        causes.append("refused: " + "; ".join(guarded.refusals[:3]))
    elif guarded.findings:
        causes.append("findings: " + "; ".join(guarded.findings[:3]))
    if guarded.rc != 0 and not guarded.refusals:
        causes.append(f"pipguard exit {guarded.rc}: {guarded.log_tail}")
    if guarded.problem:
        causes.append(guarded.problem)
    if guarded.rc == 0 and set(guarded.freeze) != set(plain.freeze):
        only_plain = sorted(set(plain.freeze) - set(guarded.freeze))
        only_guard = sorted(set(guarded.freeze) - set(plain.freeze))
        causes.append(f"installed differ: plain only {only_plain}, pipguard only {only_guard}")
    return ("mismatch", "; ".join(causes)) if causes else ("match", "")


# ----------------------------------------------------------------------------- output


def markdown(results: Sequence[Result], meta: dict) -> str:
    matched = [r for r in results if r.verdict == "match"]
    pip_fails = [r for r in results if r.verdict == "pip fails"]
    mismatched = [r for r in results if r.verdict == "mismatch"]
    ratios = sorted(r.ratio for r in results if r.ratio)
    lines = [
        f"# Ecosystem sweep ({meta['date']}, pipguard {meta['machine'].get('pipguard_tree', '?')})",
        "",
        f"`{meta['command']}`; {meta['machine'].get('nproc')} CPUs, {meta['machine'].get('python')}, "
        f"{meta['machine'].get('pip')}, venvs' pip: {meta.get('pip', 'bundled')}, isolation {meta['isolation']}, jobs {meta['jobs']}, "
        f"wall {meta['wall_s']:.0f} s.",
        "",
        f"**{len(matched)} of {len(results)} rows match plain pip**; {len(pip_fails)} fail under plain "
        f"pip too; {len(mismatched)} mismatch." + (
            f" Time ratio pipguard/plain: median {ratios[len(ratios) // 2]:.2f}, "
            f"min {ratios[0]:.2f}, max {ratios[-1]:.2f}." if ratios else ""),
        "",
        "| row | version | backend | kind | plain s | pipguard s | ratio | verdict |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for r in results:
        ratio = f"{r.ratio:.2f}" if r.ratio else "-"
        lines.append(f"| {r.row} | {r.version} | {r.backend} | {r.kind} | {r.plain.seconds:.1f} | "
                     f"{r.pipguard.seconds:.1f} | {ratio} | {r.verdict} |")
    for title, group in (("Rows that do not match", mismatched), ("Rows plain pip fails", pip_fails)):
        if group:
            lines += ["", f"## {title}", ""]
            lines += [f"- **{r.row} {r.version}**: {r.cause}" for r in group]
    return "\n".join(lines) + "\n"


def parse_args(argv: Optional[Sequence[str]] = None):
    p = argparse.ArgumentParser(prog="benchmarks/ecosystem.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Rows: " + ", ".join(r.id for r in ROWS))
    p.add_argument("--only", metavar="NAMES", help="comma-separated rows (sdist names, or "
                   "editable-BACKEND) to run; default all")
    p.add_argument("--jobs", type=int, default=1, help="rows at once (default 1)")
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/pipguard-bench/ecosystem"),
                   help="where the sdists are fetched once")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs"),
                   help="directory for the Markdown table and the JSON")
    p.add_argument("--isolation", help="pipguard install --isolation (default: pipguard's, auto)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per install")
    p.add_argument("--python", default=sys.executable, help="interpreter for the venvs")
    p.add_argument("--pip", metavar="VERSION", help="the pip of the venvs (from the index; default: the "
                   "one venv bundles, pip 23.2 on Python 3.11): each pip vendors its own pyproject-hooks")
    p.add_argument("--pipguard", help="pipguard command (default: beside this Python, or on PATH)")
    p.add_argument("--workdir", default="/tmp", help="where fresh venvs go (not in a home)")
    p.add_argument("--keep-work", action="store_true", help="keep every venv and log")
    p.add_argument("--fetch-only", action="store_true", help="fill the cache and stop")
    args = p.parse_args(argv)
    args.write_bytecode = True  # as a user has it: Bench's clean_env leaves bytecode caching on
    args.pipguard_args = ["--isolation", args.isolation] if args.isolation else []
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    rows = list(ROWS)
    if args.only:
        wanted = {canonical(n) for n in args.only.split(",") if n.strip()}
        unknown = wanted - {canonical(r.id) for r in ROWS}
        if unknown:
            raise SystemExit(f"ecosystem: unknown row(s): {', '.join(sorted(unknown))}")
        rows = [r for r in ROWS if canonical(r.id) in wanted]
    pipguard = args.pipguard.split() if args.pipguard else default_pipguard()
    cache = fetch(os.path.abspath(args.cache), rows, args.python)
    if args.fetch_only:
        log(f"ecosystem: cache ready: {cache}")
        return 0
    sweep = Sweep(args, cache, pipguard)
    started = time.time()
    try:
        sweep.bench.make_template()
        if args.pip:
            template_python = os.path.join(sweep.bench.template, "bin", "python")
            subprocess.run([template_python, "-m", "pip", "install", "-q", f"pip=={args.pip}"], check=True,
                           env=clean_env())
        log(f"ecosystem: {len(rows)} rows, jobs {args.jobs}, work dir {sweep.bench.root}")
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(sweep.row, rows))
    finally:
        if not args.keep_work:
            shutil.rmtree(sweep.bench.root, ignore_errors=True)
    meta = {"schema": "pipguard.ecosystem/1", "date": time.strftime("%Y-%m-%d %H:%M"),
            "isolation": args.isolation or "pipguard's default (auto)",
            "pip": args.pip or "the venv's bundled pip",
            "command": " ".join(["benchmarks/ecosystem.py", *(argv if argv is not None else sys.argv[1:])]),
            "jobs": args.jobs, "wall_s": time.time() - started,
            "machine": {**machine_facts(args.python, pipguard),
                        "pipguard_package": compile_pipguard(pipguard)},
            "env": {"PIP_CONFIG_FILE": clean_env()["PIP_CONFIG_FILE"], "PIP_*": "dropped"}}
    text = markdown(results, meta)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"ecosystem-{time.strftime('%Y-%m-%d')}-{git_state().split()[0]}"
                        + (f"-{args.isolation}" if args.isolation else "") + (f"-pip{args.pip}" if args.pip else ""))
    with open(stem + ".md", "w") as fh:
        fh.write(text)
    with open(stem + ".json", "w") as fh:
        json.dump({**meta, "rows": [{**asdict(r), "ratio": r.ratio} for r in results]}, fh, indent=2)
    log(f"ecosystem: wrote {stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

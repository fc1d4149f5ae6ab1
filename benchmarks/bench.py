#!/usr/bin/env python3
"""Measure what pipguard costs on real sdist builds, per layer, and at start-up.

What it does (see docs/performance.md for results and how to read them):

1. fetch: once, into the cache folder (``--cache``, default
   ``~/.cache/pipguard-bench``), a pinned set of real sdists from PyPI (pure
   Python, C extensions, Cython; setuptools, hatchling, flit_core backends)
   and their build requirements as wheels. The sdists' sha256 are pinned below
   and checked. This machine's pip configuration is neutralised
   (PIP_CONFIG_FILE=/dev/null, every PIP_* variable dropped).
2. installs: each package, into a fresh venv, with plain ``pip install
   --no-binary PKG --no-deps PKG==V`` and sandboxed, variants alternating in a
   rotating order, ``--rounds`` times, on each route (``--routes``):
     local      offline: ``--no-index --find-links CACHE``
     index      a loopback PEP 503 index (tests/support/index.py) serving
                the same cache, with basic-auth credentials in PIP_INDEX_URL, as
                a private index has (the route users run); build requirements
                come from it too
   An install counts only if pip exits 0 and the package imports in the venv
   afterwards; otherwise the cell says FAILED and nothing is timed.
   Variants (``audit``/``os``/``full`` wrap the whole pip in ``pipguard run``,
   one per layer, local route only; ``install*`` sandbox each PEP 517 hook
   call pip makes):
     plain      pip alone
     audit      pipguard run --isolation audit      (audit hooks only)
     os         pipguard run --isolation os --no-observe-reads
                                                    (+ Landlock, seccomp, supervisor)
     full       pipguard run                        (default: auto, so the namespace
                                                    backend where it works, else every
                                                    layer with reads observed)
     install    pipguard install --sandbox --python VENV PIP-ARGS
                                                    (the default, auto: the namespace
                                                    backend where it works, reads not
                                                    observed; only if that command exists)
     install-os       the same with --isolation os (the plain backend, reads observed)
     install-noreads  --isolation os --no-observe-reads (native reads are
                      still blocked by Landlock but not reported: the
                      trade-off the docs describe, measured)
     install-ns       pipguard install --sandbox --isolation ns (each hook
                      call in namespaces of its own; read observation at
                      the ns default, off: the decoys report credential reads)
     install-ns-reads the same with --observe-reads (every native open
                      notified, as under the plain backend)
   When ``pipguard install`` is missing the headline row is ``full`` and the
   output says "pipguard run (install command not available)".
   Per install, the number of hook calls (phases in pipguard's ``--report``)
   is recorded; (install - plain) / hook calls is the cost of one hook call.
   PYTHONDONTWRITEBYTECODE=1 is set for every variant unless
   ``--write-bytecode`` (see docs/performance.md for why).
3. start-up: ``pipguard run -- true`` against ``true`` (and a Python no-op),
   median of ``--startup-n`` runs.
4. per-event cost: an import-heavy workload and N ``open()`` calls of an
   allowed file, timed inside the process, plain and under each layer; the
   difference divided by the number of audit events (or opens). And a C
   program (compiled here with gcc/cc) timing N native ``open()`` calls of
   /usr/include/stdio.h: plain, ``pipguard run --no-observe-reads`` and
   ``pipguard run`` (reads observed): µs per open; the difference of the last
   two is what one observed (seccomp-notified) read costs.

Output: a Markdown report on stdout; ``--json FILE`` writes every sample and
the load average before and after (the figures are noisy when it is high).
``--profile PKG`` instead runs one sandboxed build of PKG (``--profile-variant``,
default full) with the pipguard process under cProfile and prints its hottest
functions (launcher + supervisor; the sandboxed processes are not profiled).

No timing here is an assertion: this is a measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

# --------------------------------------------------------------------------
# The pinned corpus. sha256 are those of the sdists on PyPI.


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    module: str  # what must import after the install
    kind: str  # pure / C ext / Cython
    backend: str
    sha256: str

    @property
    def req(self) -> str:
        return f"{self.name}=={self.version}"


PACKAGES = (
    Package("six", "1.16.0", "six", "pure", "setuptools (setup.py)",
            "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926"),
    Package("idna", "3.10", "idna", "pure", "flit_core",
            "12f65c9b470abda6dc35cf8e63cc574b1c52b11df2c86030af0ac09b01b13ea9"),
    Package("packaging", "24.1", "packaging", "pure", "flit_core",
            "026ed72c8ed3fcce5bf8950572258698927fd1dbda10a5e981cdf0ac37f4f002"),
    Package("iniconfig", "2.0.0", "iniconfig", "pure", "hatchling + hatch-vcs",
            "2d91e135bf72d31a410b17c16da610a82cb55f6b0477d1a902134b24a455b8b3"),
    Package("attrs", "24.2.0", "attrs", "pure", "hatchling + hatch-vcs + fancy-pypi-readme",
            "5cfb1b9148b5b086569baec03f20d7b6bf3bcacc9a42bebf87ffaaca362f6346"),
    Package("pycparser", "2.22", "pycparser", "pure", "setuptools (setup.py)",
            "491c8be9c040f5390f5bf44a5b07752bd07f56edf992381b05c701439eec10f6"),
    Package("markupsafe", "2.1.5", "markupsafe._speedups", "C ext", "setuptools (setup.py)",
            "d283d37a890ba4c1ae73ffadf8046435c76e7bc2247bbb63c00bd1a709c6544b"),
    Package("simplejson", "3.19.3", "simplejson._speedups", "C ext", "setuptools (setup.py)",
            "8e086896c36210ab6050f2f9f095a5f1e03c83fa0e7f296d6cba425411364680"),
    Package("wrapt", "1.16.0", "wrapt._wrappers", "C ext", "setuptools (setup.py)",
            "5f370f952971e7d17c7d1ead40e49f32345a7f7a5373571ef44d800d06b1899d"),
    Package("msgpack", "1.1.0", "msgpack._cmsgpack", "C++ ext", "setuptools",
            "dd432ccc2c72b914e4cb77afce64aab761c1137cc698be3984eee260bcb2896e"),
    Package("psutil", "6.0.0", "psutil._psutil_linux", "C ext", "setuptools",
            "8faae4f310b6d969fa26ca0545338b21f73c6b15db7c4a8d934a5482faa818f2"),
    Package("pyyaml", "6.0.2", "yaml._yaml", "Cython + libyaml", "setuptools + Cython (in-tree)",
            "d584d9ec91ad65861cc08d42e834324ef890a082e591037abe114850ff7bbc3e"),
)

# Build requirements of the set above, and their dependencies, as wheels.
# idna needs flit_core<4, hence two flit_core versions.
BUILD_WHEELS = (
    "setuptools==84.2.1", "wheel==0.48.0", "Cython==3.3.1",
    "flit_core==3.12.0", "flit_core==4.2.0",
    "hatchling==1.33.0", "hatch-vcs==0.5.0", "hatch-fancy-pypi-readme==25.1.0",
    "packaging==26.4", "pathspec==1.1.1", "pluggy==1.7.0", "trove-classifiers==2026.9.21.13",
    "setuptools-scm==10.3.4", "vcs-versioning==2.6.0", "tomlkit==0.15.2",
)

VARIANT_HELP = {
    "plain": "pip install (no pipguard)",
    "audit": "pipguard run --isolation audit (audit hooks only)",
    "os": "pipguard run --isolation os --no-observe-reads (+ Landlock, seccomp, supervisor)",
    "full": "pipguard run (default: auto)",
    "install": "pipguard install --sandbox (default: auto, the namespace backend where it works)",
    "install-os": "pipguard install --sandbox --isolation os (plain backend, reads observed)",
    "install-noreads": "pipguard install --sandbox --isolation os --no-observe-reads (the documented "
                       "trade-off: native reads still blocked, not reported)",
    "install-ns": "pipguard install --sandbox --isolation ns (namespace backend; read observation "
                  "at its default, off: decoys report credential reads)",
    "install-ns-reads": "pipguard install --sandbox --isolation ns --observe-reads (namespace backend, "
                        "every native open observed)",
}
ALL_VARIANTS = ("plain", "audit", "os", "full", "install", "install-os", "install-noreads", "install-ns",
                "install-ns-reads")
#: the options each pipguard-install variant adds to ``install --sandbox``
INSTALL_VARIANTS = {"install": [], "install-os": ["--isolation", "os"],
                    "install-noreads": ["--isolation", "os", "--no-observe-reads"],
                    "install-ns": ["--isolation", "ns"],
                    "install-ns-reads": ["--isolation", "ns", "--observe-reads"]}

IMPORT_WORKLOAD = (
    "email.mime.multipart", "email.policy", "json", "http.client", "http.server",
    "xml.dom.minidom", "xml.etree.ElementTree", "asyncio", "decimal", "fractions",
    "unittest", "argparse", "logging.handlers", "sqlite3", "csv", "tarfile", "zipfile",
    "ssl", "urllib.request", "multiprocessing.pool", "concurrent.futures", "dataclasses",
    "inspect", "pydoc", "difflib", "pickletools", "statistics", "tomllib", "venv",
    "ensurepip", "importlib.metadata", "wsgiref.simple_server", "xmlrpc.client", "smtplib",
    "imaplib", "ftplib", "mailbox", "shelve", "cProfile", "pstats", "trace", "doctest",
)

# The workload runs in the measured interpreter and times itself, so start-up
# is excluded. With "count" it counts the audit events it raises.
WORKLOAD_SOURCE = r'''
import json, sys, time
mode, n = sys.argv[1], int(sys.argv[2])
counter = [0]
if len(sys.argv) > 3 and sys.argv[3] == "count":
    sys.addaudithook(lambda event, args: counter.__setitem__(0, counter[0] + 1))
if mode == "imports":
    import importlib
    names = sys.argv[4:] if len(sys.argv) > 4 else %(imports)r
    t0 = time.perf_counter()
    for name in names:
        importlib.import_module(name)
    elapsed = time.perf_counter() - t0
else:
    path = __file__
    t0 = time.perf_counter()
    for _ in range(n):
        open(path, "rb").close()
    elapsed = time.perf_counter() - t0
print("PGBENCH " + json.dumps({"elapsed": elapsed, "events": counter[0]}))
''' % {"imports": list(IMPORT_WORKLOAD)}


# Native opens: a C program timing N open()+close() of one allowed file
# (openat(2) through libc, no Python, no audit hook). Under ``pipguard run``
# with reads observed each open is a seccomp user notification the
# supervisor answers; with --no-observe-reads it is not notified at all
# (Landlock still checks it in the kernel).
NATIVE_OPEN_SOURCE = r'''
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000, failed = 0;
    const char *path = argc > 2 ? argv[2] : "/usr/include/stdio.h";
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) failed++; else close(fd);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("PGBENCH {\"elapsed\": %.9f, \"opens\": %ld, \"failed\": %ld}\n",
           (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9, n, failed);
    return failed ? 1 : 0;
}
'''


# --------------------------------------------------------------------------
# helpers


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def clean_env(write_bytecode: bool = True) -> Dict[str, str]:
    """This process's environment without any pip or Python configuration:
    the machine's pip config (find-links, extra indexes, constraints) would
    change what is measured. A route adds its own PIP_INDEX_URL."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    if not write_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def sha256(path: str) -> str:
    from pipguard.sandbox.files import sha256 as file_sha256

    return file_sha256(path)


def median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def sdist_path(dist: str, pkg: Package) -> Optional[str]:
    """The cached sdist of ``pkg`` (names compared PEP 503-normalised)."""
    want = re.sub(r"[-_.]+", "-", f"{pkg.name}-{pkg.version}").lower()
    for name in os.listdir(dist):
        if name.endswith(".tar.gz") and re.sub(r"[-_.]+", "-", name[:-7]).lower() == want:
            return os.path.join(dist, name)
    return None


def pip_download(python: str, args: List[str], dest: str) -> None:
    cmd = [python, "-m", "pip", "download", "--disable-pip-version-check", "-q",
           "-d", dest, *args]
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, env=clean_env(), check=True)


def fetch(cache: str, packages: Sequence[Package], python: str) -> str:
    """Fill ``cache/dist`` once; return its path. Checks the sdists' hashes."""
    dist = os.path.join(cache, "dist")
    os.makedirs(dist, exist_ok=True)
    missing = [p for p in packages if sdist_path(dist, p) is None]
    if missing:
        # pip download prepares each sdist's metadata (runs its build backend,
        # outside any sandbox): acceptable for this pinned, well-known set.
        # sdists of these packages only: their build requirements may come as wheels (with
        # :all: they would be built from source too: Cython alone takes minutes)
        pip_download(python, ["--no-deps", "--no-binary", ",".join(p.name for p in missing),
                              *(p.req for p in missing)], dist)
    stamp = os.path.join(dist, ".build-wheels")
    want = "\n".join(BUILD_WHEELS)
    if not os.path.exists(stamp) or open(stamp).read() != want:
        for req in BUILD_WHEELS:  # one at a time: two flit_core versions
            pip_download(python, ["--only-binary", ":all:", "--no-deps", req], dist)
        with open(stamp, "w") as fh:
            fh.write(want)
    for p in packages:
        path = sdist_path(dist, p)
        if path is None:
            raise SystemExit(f"bench: {p.req}: no sdist in {dist} after download")
        got = sha256(path)
        if got != p.sha256:
            raise SystemExit(f"bench: {path}: sha256 {got} != pinned {p.sha256}")
    return dist


def machine_facts(python: str, pipguard: List[str]) -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    def out(cmd: List[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, env=clean_env(),
                                  timeout=60).stdout.strip().splitlines()[0]
        except Exception as exc:  # a fact we could not get is recorded as such
            return f"unknown ({exc.__class__.__name__})"

    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": out([python, "-c", "import sys; print(sys.version.split()[0])"]),
        "pip": out([python, "-m", "pip", "--version"]).split(" from ")[0],
        "cc": out(["cc", "--version"]),
        "pipguard": out([*pipguard, "--version"]),
        "pipguard_tree": git_state(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def git_state() -> str:
    """Commit of the pipguard checkout this script lives in (+ "dirty")."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--", "pipguard"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (head or "unknown") + (" + uncommitted changes in pipguard/" if dirty else "")


# --------------------------------------------------------------------------
# one timed command


@dataclass
class Sample:
    variant: str
    package: str
    round: int
    seconds: Optional[float]  # None: failed
    detail: str = ""
    route: str = "local"
    hook_calls: Optional[int] = None  # phases in pipguard's report (install variants)
    hook_s: Optional[float] = None  # their summed durations, as the report says


ROUTES = ("local", "index")
RUN_VARIANTS = ("audit", "os", "full")  # pipguard run around the whole pip: local route only


def timed(cmd: List[str], cwd: str, logfile: str, env: Dict[str, str],
          timeout: float = 900) -> "tuple[int, float]":
    with open(logfile, "ab") as fh:
        fh.write(("$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        # Not subprocess.run(timeout=): its wait polls with sleeps of up to 50 ms, so every
        # sample came out up to 50 ms late (totals quantised to 0.05 s); a blocking wait
        # returns when the process ends, and a timer kills it on timeout.
        import threading

        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=fh, stderr=fh, env=env)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            rc = proc.wait()
        finally:
            timer.cancel()
        elapsed = time.perf_counter() - t0
        return (124 if rc == -9 and elapsed >= timeout else rc), elapsed


class Bench:
    def __init__(self, args, dist: str, pipguard: List[str]) -> None:
        self.args = args
        self.dist = dist
        self.pipguard = pipguard
        self.env = clean_env(getattr(args, "write_bytecode", False))
        self.root = tempfile.mkdtemp(prefix="pipguard-bench-", dir=args.workdir)
        self.template = os.path.join(self.root, "template-venv")
        self.install_cmd = self._detect_install()
        self.index = None  # the loopback index, started by installs() for the index route

    def route_env(self, route: str) -> Dict[str, str]:
        if route == "local":
            return self.env
        return {**self.env, "PIP_INDEX_URL": self.index.url}

    def _detect_install(self) -> Optional[str]:
        """'pipguard install --help' text when that command exists, else None."""
        try:
            proc = subprocess.run([*self.pipguard, "install", "--help"], capture_output=True,
                                  text=True, env=self.env, timeout=60, cwd=self.root)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    def make_template(self) -> None:
        subprocess.run([self.args.python, "-m", "venv", self.template], check=True, env=self.env)

    def fresh(self, tag: str) -> "tuple[str, str]":
        """(venv, work dir): a copy of the template venv and an empty directory,
        both outside any home directory (pipguard run refuses to make a home writable)."""
        base = tempfile.mkdtemp(prefix=tag + "-", dir=self.root)
        venv = os.path.join(base, "venv")
        shutil.copytree(self.template, venv, symlinks=True)
        work = os.path.join(base, "work")
        os.mkdir(work)
        return venv, work

    def pip_args(self, pkg: Package, route: str = "local") -> List[str]:
        where = ["--no-index", "--find-links", self.dist] if route == "local" else []
        return ["install", *where, "--no-cache-dir", "--no-binary", pkg.name, "--no-deps", pkg.req]

    def command(self, variant: str, pkg: Package, venv: str, work: str,
                route: str = "local") -> List[str]:
        py = os.path.join(venv, "bin", "python")
        pip = [py, "-m", "pip", *self.pip_args(pkg, route)]
        report = ["--report", os.path.join(work, "..", "report.json")]
        grants = ["--allow-read", self.dist, "--allow-write", venv]
        if variant == "plain":
            return pip
        if variant == "audit":
            return [*self.pipguard, "run", "--isolation", "audit", *grants, *report, "--", *pip]
        if variant == "os":
            return [*self.pipguard, "run", "--isolation", "os", "--no-observe-reads", *grants,
                    *report, "--", *pip]
        if variant == "full":
            return [*self.pipguard, "run", *grants, *report, "--", *pip]
        if variant in INSTALL_VARIANTS:
            help_text = self.install_cmd or ""
            cmd = [*self.pipguard, "install", "--sandbox", *report, *INSTALL_VARIANTS[variant]]
            if "--python" in help_text:
                cmd += ["--python", py]
            else:  # pip's own option: install into the venv's layout
                cmd += ["--prefix", venv]
            # No --allow-read/--allow-write: the real pip (outside the sandboxes)
            # reads the cache and writes the venv; hook calls need neither.
            return cmd + self.pip_args(pkg, route)[1:]
        raise ValueError(variant)

    def install_once(self, variant: str, pkg: Package, rnd: int, route: str = "local") -> Sample:
        venv, work = self.fresh(f"{pkg.name}-{route}-{variant}-r{rnd}")
        logfile = os.path.join(work, "..", "log.txt")
        rc, seconds = timed(self.command(variant, pkg, venv, work, route), work, logfile,
                            self.route_env(route))
        detail = ""
        if rc != 0:
            detail = f"exit {rc}"
        else:
            check = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                                    f"import {pkg.module}"], capture_output=True, text=True,
                                   env=self.env, cwd=work)
            if check.returncode != 0:
                detail = "import failed: " + (check.stderr.strip().splitlines() or ["?"])[-1]
        events = hook_calls = hook_s = None
        report_path = os.path.join(work, "..", "report.json")
        if os.path.exists(report_path):
            try:
                with open(report_path) as fh:
                    report = json.load(fh)
                events = len(report.get("events", ()))
                phases = report.get("phases")
                if variant.startswith("install") and isinstance(phases, list):
                    hook_calls = len(phases)
                    hook_s = round(sum(ph.get("duration") or 0 for ph in phases), 4)
                if not detail and report.get("verdict") not in (None, "clean"):
                    blocked = [e for e in report.get("events", ()) if e.get("action") == "blocked"]
                    detail = f"verdict {report.get('verdict')} ({len(blocked)} blocked)"
            except (OSError, ValueError):
                pass
        if detail:
            log(f"  {route:5s} {variant:15s} {pkg.req:20s} FAILED ({detail}); log kept in {logfile}")
            return Sample(variant, pkg.name, rnd, None, detail, route)
        log(f"  {route:5s} {variant:15s} {pkg.req:20s} {seconds:7.2f} s" +
            (f"  ({events} events)" if events is not None else "") +
            (f"  ({hook_calls} hook calls, {hook_s:.2f} s in them)" if hook_calls is not None else ""))
        if not self.args.keep_work:
            shutil.rmtree(os.path.dirname(work), ignore_errors=True)
        return Sample(variant, pkg.name, rnd, seconds, "" if events is None else f"events={events}",
                      route, hook_calls, hook_s)

    # -------------------------------------------------------------- sections
    def installs(self, packages: Sequence[Package], variants: Sequence[str],
                 routes: Sequence[str] = ("local",)) -> List[Sample]:
        samples: List[Sample] = []
        if "index" in routes and self.index is None:
            # the test suite's index (one implementation; it needs only packaging)
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            os.pardir, "tests", "support"))
            from index import LoopbackIndex

            self.index = LoopbackIndex([self.dist]).start()
        # (route, variant) cells, alternated together: the routes see the same drift.
        cells = [(r, v) for r in routes for v in variants
                 if not (r != "local" and v in RUN_VARIANTS)]
        try:
            # Warm the page cache (interpreter, compiler, wheels): not timed.
            log("warm-up (not timed)")
            for route in routes:
                for variant in ("plain", *(v for v in variants if v.startswith("install"))):
                    self.install_once(variant, packages[0], -1, route)
            for rnd in range(self.args.rounds):
                log(f"round {rnd + 1}/{self.args.rounds}")
                for i, pkg in enumerate(packages):
                    # Rotate the order every package and round: A/B alternation
                    # spreads slow drift (thermal, page cache) over all variants.
                    k = (rnd + i) % len(cells)
                    for route, variant in cells[k:] + cells[:k]:
                        samples.append(self.install_once(variant, pkg, rnd, route))
        finally:
            if self.index is not None:
                self.index.stop()
                self.index = None
        return samples

    def startup(self) -> dict:
        n = self.args.startup_n
        work = tempfile.mkdtemp(prefix="startup-", dir=self.root)
        true = shutil.which("true") or "/bin/true"
        py = self.args.python
        cases = {
            "true": [true],
            "pipguard run -- true": [*self.pipguard, "run", "--", true],
            "pipguard run --isolation audit -- true": [*self.pipguard, "run", "--isolation",
                                                       "audit", "--", true],
            "python -c pass": [py, "-c", "pass"],
            "pipguard run -- python -c pass": [*self.pipguard, "run", "--", py, "-c", "pass"],
            "pipguard --version": [*self.pipguard, "--version"],
        }
        times: Dict[str, List[float]] = {k: [] for k in cases}
        failed: Dict[str, str] = {}
        for _ in range(n):  # interleaved, like the installs
            for name, cmd in cases.items():
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, cwd=work, env=self.env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
                dt = time.perf_counter() - t0
                if proc.returncode != 0:
                    failed[name] = f"exit {proc.returncode}"
                else:
                    times[name].append(dt)
        return {"n": n, "median_s": {k: median(v) for k, v in times.items()},
                "samples_s": times, "failed": failed}

    def hook_cost(self) -> dict:
        """In-process timings of the workload, plain and under each layer."""
        work = tempfile.mkdtemp(prefix="hook-", dir=self.root)
        script = os.path.join(work, "workload.py")
        with open(script, "w") as fh:
            fh.write(WORKLOAD_SOURCE)
        py = self.args.python
        n_open = self.args.opens
        layers = {
            "plain": [],
            "audit": [*self.pipguard, "run", "--isolation", "audit", "--"],
            "os": [*self.pipguard, "run", "--isolation", "os", "--no-observe-reads", "--"],
            "full": [*self.pipguard, "run", "--"],
        }

        def one(prefix: List[str], mode: str, n: int, count: bool = False) -> Optional[dict]:
            cmd = [*prefix, py, script, mode, str(n)] + (["count"] if count else [])
            proc = subprocess.run(cmd, cwd=work, env=self.env, capture_output=True, text=True)
            for line in proc.stdout.splitlines():
                if line.startswith("PGBENCH "):
                    return json.loads(line[8:])
            log(f"  hook workload failed: {' '.join(cmd)}: {proc.stderr.strip()[-300:]}")
            return None

        out: dict = {"opens": n_open, "modules": len(IMPORT_WORKLOAD)}
        counted = one([], "imports", 0, count=True)
        out["import_audit_events"] = counted["events"] if counted else None
        counted = one([], "open", n_open, count=True)
        out["open_audit_events"] = counted["events"] if counted else None
        for mode, n in (("imports", 0), ("open", n_open)):
            times: Dict[str, List[float]] = {k: [] for k in layers}
            for _ in range(self.args.hook_reps):
                for name, prefix in layers.items():
                    got = one(prefix, mode, n)
                    if got:
                        times[name].append(got["elapsed"])
            out[mode] = {k: median(v) for k, v in times.items()}
            out[mode + "_samples"] = times
        out["native"] = self.native_open_cost(work)
        return out

    def native_open_cost(self, work: str) -> Optional[dict]:
        """µs per open() of a compiled C loop: plain, pipguard run
        --no-observe-reads, pipguard run (reads observed). None without a
        C compiler."""
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            log("  native opens: no gcc/cc, skipped")
            return None
        src = os.path.join(work, "opens.c")
        exe = os.path.join(work, "opens")
        with open(src, "w") as fh:
            fh.write(NATIVE_OPEN_SOURCE)
        proc = subprocess.run([cc, "-O2", "-o", exe, src], capture_output=True, text=True)
        if proc.returncode != 0:
            log(f"  native opens: compile failed: {proc.stderr.strip()[-300:]}")
            return None
        target = "/usr/include/stdio.h" if os.path.exists("/usr/include/stdio.h") else exe
        n = self.args.opens
        layers = {
            "plain": [],
            "os": [*self.pipguard, "run", "--no-observe-reads", "--"],
            "full": [*self.pipguard, "run", "--"],
        }
        taskset = shutil.which("taskset")
        if taskset:  # same, with pipguard and the sandbox on one CPU: no cross-CPU wake-ups
            layers["full_cpu0"] = [taskset, "-c", "0", *self.pipguard, "run", "--"]
        times: Dict[str, List[float]] = {k: [] for k in layers}
        for _ in range(self.args.hook_reps):
            for name, prefix in layers.items():
                cmd = [*prefix, exe, str(n), target]
                proc = subprocess.run(cmd, cwd=work, env=self.env, capture_output=True, text=True)
                got = next((json.loads(line[8:]) for line in proc.stdout.splitlines()
                            if line.startswith("PGBENCH ")), None)
                if proc.returncode != 0 or got is None:
                    log(f"  native opens failed: {' '.join(cmd)}: exit {proc.returncode}: "
                        f"{proc.stderr.strip()[-300:]}")
                    continue
                times[name].append(got["elapsed"])
        med = {k: median(v) for k, v in times.items()}
        return {"opens": n, "path": target, "compiler": cc, "median_s": med, "samples_s": times,
                "us_per_open": {k: (v / n * 1e6 if v is not None else None)
                                for k, v in med.items()}}

    def profile(self, pkg: Package, top: int, variant: str) -> str:
        """One sandboxed build of ``pkg`` with the pipguard process under cProfile."""
        import pstats

        venv, work = self.fresh(f"profile-{pkg.name}")
        prof = os.path.join(work, "..", "pipguard.prof")
        cmd = self.command(variant, pkg, venv, work)
        # same arguments, but "python -m cProfile -m pipguard.cli.app" instead of "pipguard"
        cmd = [sys.executable, "-m", "cProfile", "-o", prof, "-m", "pipguard.cli.app",
               *cmd[len(self.pipguard):]]
        rc, seconds = timed(cmd, work, os.path.join(work, "..", "log.txt"), self.env)
        stats = pstats.Stats(prof)
        total = stats.total_tt
        rows = []
        for func, (cc, nc, tt, ct, _callers) in stats.stats.items():
            rows.append((tt, ct, nc, func))
        rows.sort(reverse=True)
        lines = [f"cProfile of `{variant}` ({VARIANT_HELP[variant]}) for {pkg.req} (exit {rc}, "
                 f"{seconds:.2f} s wall, {total:.2f} s in the pipguard process)", "",
                 "| function | calls | tottime s | share | cumtime s |", "|---|---:|---:|---:|---:|"]
        for tt, ct, nc, (file, line, name) in rows[:top]:
            where = f"{os.path.relpath(file) if file.startswith('/') else file}:{line}({name})"
            lines.append(f"| `{where}` | {nc} | {tt:.3f} | {tt / total:.1%} | {ct:.3f} |")
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# report


def fmt_s(value: Optional[float]) -> str:
    return "FAILED" if value is None else f"{value:.2f}"


def summarize(samples: List[Sample], packages: Sequence[Package], variants: Sequence[str],
              route: str = "local") -> dict:
    """Medians per package and variant on one route; totals over the packages
    no variant failed; ratios to plain: of the totals, and the median of the
    per-package ratios; the cost of one hook call."""
    samples = [s for s in samples if s.route == route]
    per: Dict[str, Dict[str, dict]] = {}
    for pkg in packages:
        per[pkg.name] = {}
        for v in variants:
            mine = [s for s in samples if s.package == pkg.name and s.variant == v]
            ok = [s.seconds for s in mine if s.seconds is not None]
            fails = [s.detail for s in mine if s.seconds is None]
            calls = [s.hook_calls for s in mine if s.hook_calls is not None]
            per[pkg.name][v] = {"median_s": median(ok) if not fails else None,
                                "samples_s": ok, "failed": fails,
                                "hook_calls": median(calls),
                                "hook_s": median([s.hook_s for s in mine if s.hook_s is not None]),
                                "events": [s.detail for s in mine if s.detail.startswith("events=")]}
    totals: Dict[str, Optional[float]] = {}
    ratio_total: Dict[str, Optional[float]] = {}
    ratio_median: Dict[str, Optional[float]] = {}
    per_call: Dict[str, Optional[float]] = {}
    good = [p.name for p in packages if all(per[p.name][v]["median_s"] is not None for v in variants)]
    for v in variants:
        totals[v] = sum(per[name][v]["median_s"] for name in good) if good else None
    for v in variants:
        if v == "plain" or not totals.get("plain"):
            continue
        ratio_total[v] = totals[v] / totals["plain"]
        ratio_median[v] = median([per[n][v]["median_s"] / per[n]["plain"]["median_s"] for n in good])
        calls = sum(per[n][v]["hook_calls"] or 0 for n in good)
        per_call[v] = (totals[v] - totals["plain"]) / calls if calls else None
    return {"route": route, "per_package": per, "total_s": totals, "total_over": good,
            "ratio_total": ratio_total, "ratio_median": ratio_median,
            "overhead_per_hook_call_s": per_call}


def markdown(result: dict, packages: Sequence[Package], variants: Sequence[str],
             headline: str, headline_label: str) -> str:
    facts = result["machine"]
    lines = ["# pipguard benchmark", "",
             f"Machine: {facts['nproc']} vCPU ({facts['cpu']}), Linux {facts['kernel']}, "
             f"Python {facts['python']}, {facts['pip']}, {facts['cc']}, {facts['pipguard']} "
             f"(tree {facts.get('pipguard_tree', '?')}); "
             f"{facts['date']}.", "",
             f"pipguard package: {facts.get('pipguard_package', '?')}.", ""]
    if facts.get("loadavg_before") is not None:
        lines += [f"Load average (1, 5, 15 min) before the installs: {facts['loadavg_before']}, "
                  f"after: {result.get('loadavg_after')}" +
                  (" — the machine was busy: the figures are noisy." if max(
                      facts["loadavg_before"][0], (result.get("loadavg_after") or [0])[0]) >
                   0.5 * (facts["nproc"] or 1) else "."), ""]
    routes = result.get("routes") or {}
    if routes:
        lines += markdown_side_by_side(routes, variants, result["rounds"])
    for route, summary in routes.items():
        lines += markdown_route(route, summary, packages, variants, result["rounds"], headline_label)
    if not routes and result.get("installs"):  # a pipguard.bench/1 result
        lines += markdown_route("local", result["installs"], packages, variants, result["rounds"],
                                headline_label)
    lines += markdown_rest(result, headline, headline_label)
    return "\n".join(lines)


ROUTE_HELP = {"local": "offline, `--no-index --find-links CACHE`",
              "index": "loopback PEP 503 index with credentials in `PIP_INDEX_URL`"}


def markdown_side_by_side(routes: Dict[str, dict], variants: Sequence[str], rounds: int) -> List[str]:
    others = [v for v in variants if v.startswith("install")]
    lines = [f"## Side by side (median of {rounds} rounds; totals over the packages no variant "
             "failed)", "",
             "| route | pkgs | plain s | " + " | ".join(
                 f"{v} s | × total | × median/pkg | s per hook call" for v in others) + " |",
             "|---|---:|---:|" + "---:|---:|---:|---:|" * len(others)]
    for route, summary in routes.items():
        tot = summary["total_s"]
        cells = [f"{route} ({ROUTE_HELP.get(route, route)})", str(len(summary["total_over"])),
                 fmt_s(tot.get("plain"))]
        for v in others:
            rt, rm = summary["ratio_total"].get(v), summary["ratio_median"].get(v)
            pc = summary["overhead_per_hook_call_s"].get(v)
            cells += [fmt_s(tot.get(v)), f"**{rt:.2f}**" if rt is not None else "–",
                      f"{rm:.2f}" if rm is not None else "–",
                      f"{pc:.3f}" if pc is not None else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "s per hook call = (variant total − plain total) / hook calls "
              "(phases in pipguard's report) over the same packages.", ""]
    return lines


def markdown_route(route: str, summary: dict, packages: Sequence[Package], variants: Sequence[str],
                   rounds: int, headline_label: str) -> List[str]:
    lines: List[str] = []
    variants = [v for v in variants if v in next(iter(summary["per_package"].values()), {})]
    if summary:
        lines += [f"## Installs from sdist, {route} route: {ROUTE_HELP.get(route, route)} "
                  f"(median of {rounds} rounds, seconds; ratio = variant / plain)", ""]
        lines += [f"Headline sandbox: **{headline_label}**.", ""]
        for v in variants:
            lines.append(f"- `{v}`: {VARIANT_HELP[v]}")
        lines.append("")
        others = [v for v in variants if v != "plain"]
        head = "| package | kind | backend | plain | " + " | ".join(
            f"{v} | ×" for v in others) + " |"
        lines += [head, "|" + "---|" * 3 + "---:|" + "---:|---:|" * len(others)]
        for pkg in packages:
            row = summary["per_package"][pkg.name]
            plain = row["plain"]["median_s"]
            cells = [f"{pkg.req}", pkg.kind, pkg.backend, fmt_s(plain)]
            for v in others:
                m = row[v]["median_s"]
                cells += [fmt_s(m), f"{m / plain:.2f}" if m is not None and plain else "–"]
            lines.append("| " + " | ".join(cells) + " |")
        tot = summary["total_s"]
        if tot.get("plain"):
            cells = [f"**total** ({len(summary['total_over'])} pkgs)", "", "", f"{tot['plain']:.2f}"]
            for v in others:
                cells += [f"{tot[v]:.2f}", f"**{tot[v] / tot['plain']:.2f}**"]
            lines.append("| " + " | ".join(cells) + " |")
        calls = {v: [(p.name, summary["per_package"][p.name][v]["hook_calls"]) for p in packages]
                 for v in others if v.startswith("install")}
        for v, got in calls.items():
            if any(n is not None for _, n in got):
                lines += ["", f"Hook calls per package under `{v}` (phases in pipguard's report): " +
                          ", ".join(f"{name} {n if n is not None else '–'}" for name, n in got) + "."]
        lines.append("")
        fails = [(p, v, f) for p, row in summary["per_package"].items() for v, cell in row.items()
                 for f in cell["failed"]]
        for p, v, f in fails:
            lines.append(f"- FAILED: {p} under `{v}`: {f}")
        if fails:
            lines.append("")
    return lines


def markdown_rest(result: dict, headline: str, headline_label: str) -> List[str]:
    lines: List[str] = []
    start = result.get("startup")
    if start:
        med = start["median_s"]
        lines += [f"## Start-up (median of {start['n']} runs, ms)", "",
                  "| command | ms |", "|---|---:|"]
        for name, value in med.items():
            lines.append(f"| `{name}` | {'FAILED' if value is None else f'{value * 1000:.1f}'} |")
        if med.get("true") is not None and med.get("pipguard run -- true") is not None:
            over = (med["pipguard run -- true"] - med["true"]) * 1000
            lines += ["", f"`pipguard run -- true` costs **{over:.0f} ms** over `true` "
                          f"(target ≤ 50 ms: {'met' if over <= 50 else 'NOT met'})."]
        lines.append("")
    hook = result.get("hook")
    if hook:
        lines += [f"## Per-event cost (in-process timings, median of {result['hook_reps']} runs)", ""]
        n_ev = hook.get("import_audit_events")
        n_open_ev = hook.get("open_audit_events")
        lines += [f"Workload A: import {hook['modules']} standard-library modules "
                  f"({n_ev} audit events). Workload B: {hook['opens']} × `open(allowed file).close()` "
                  f"({n_open_ev} audit events).", "",
                  "| layer | imports ms | Δ vs plain µs/event | opens ms | Δ vs plain µs/open |",
                  "|---|---:|---:|---:|---:|"]
        for layer in ("plain", "audit", "os", "full"):
            a = hook["imports"].get(layer)
            b = hook["open"].get(layer)
            a0, b0 = hook["imports"].get("plain"), hook["open"].get("plain")
            da = f"{(a - a0) / n_ev * 1e6:.1f}" if a is not None and a0 is not None and n_ev else "–"
            db = f"{(b - b0) / hook['opens'] * 1e6:.1f}" if b is not None and b0 is not None else "–"
            lines.append(f"| {layer} | {fmt_ms(a)} | {da if layer != 'plain' else ''} | "
                         f"{fmt_ms(b)} | {db if layer != 'plain' else ''} |")
        lines.append("")
        native = hook.get("native")
        if native:
            per = native["us_per_open"]
            lines += [f"Workload C (native): a C program timing {native['opens']} × "
                      f"`open({native['path']})` + `close` in-process (no Python, no audit hook; "
                      f"median of {result['hook_reps']} runs).", "",
                      "| layer | ms | µs/open | Δ vs plain µs/open |", "|---|---:|---:|---:|"]
            labels = {"plain": "plain", "os": "`pipguard run --no-observe-reads`",
                      "full": "`pipguard run` (reads observed)",
                      "full_cpu0": "`taskset -c 0 pipguard run` (reads observed, one CPU)"}
            for layer in labels:
                if layer not in native["median_s"]:
                    continue
                m = native["median_s"].get(layer)
                u, u0 = per.get(layer), per.get("plain")
                d = f"{u - u0:.1f}" if layer != "plain" and u is not None and u0 is not None else ""
                lines.append(f"| {labels[layer]} | {fmt_ms(m)} | "
                             f"{'FAILED' if u is None else f'{u:.2f}'} | {d} |")
            if per.get("full") is not None and per.get("os") is not None:
                lines += ["", f"One observed native open costs **{per['full'] - per['os']:.0f} µs** "
                              "(reads observed minus --no-observe-reads)."]
            lines.append("")
    for route, summary in (result.get("routes") or {"local": result.get("installs")}).items():
        if summary and summary["total_s"].get("plain") and summary["total_s"].get(headline):
            ratio = summary["total_s"][headline] / summary["total_s"]["plain"]
            lines += [f"Target total ≤ 1.10× plain pip ({headline_label}, {route} route): "
                      f"**{ratio:.2f}×** — {'met' if ratio <= 1.10 else 'NOT met'} "
                      f"(goal 1.03×: {'met' if ratio <= 1.03 else 'not met'}).", ""]
    return lines


def fmt_ms(value: Optional[float]) -> str:
    return "FAILED" if value is None else f"{value * 1000:.1f}"


# --------------------------------------------------------------------------


def pipguard_python(pipguard: List[str]) -> Optional[str]:
    """The interpreter that runs the pipguard command (its script's shebang)."""
    if "python" in os.path.basename(pipguard[0]):
        return pipguard[0]
    try:
        with open(pipguard[0], "rb") as fh:
            first = fh.readline().decode(errors="replace").strip()
    except OSError:
        return None
    return first[2:].split()[0] if first.startswith("#!") else None


def compile_pipguard(pipguard: List[str]) -> str:
    """Write the bytecode of the pipguard package the command imports, and say where it is.

    Every variant runs with PYTHONDONTWRITEBYTECODE=1, so a checkout or an editable install
    whose modules changed since their last import would compile them again in every timed run
    (tens of ms per pipguard start) -- which a user's ``pip install pipguard`` never does (pip
    compiles at install time). Recorded in the machine facts."""
    python = pipguard_python(pipguard)
    if python is None:
        return "unknown (not compiled: no interpreter found for the pipguard command)"
    script = ("import compileall, os, pipguard; d = os.path.dirname(pipguard.__file__); "
              "compileall.compile_dir(d, quiet=1); print(d)")
    # -I: not the current directory first (the bench runs from a checkout, whose pipguard it
    # would compile instead of the one the command imports)
    proc = subprocess.run([python, "-I", "-c", script], capture_output=True, text=True, env=clean_env(), timeout=300)
    where = proc.stdout.strip() or f"unknown (compile failed: {proc.stderr.strip()[-200:]})"
    editable = not any(part in where for part in ("site-packages", "dist-packages"))
    return f"{where} (bytecode compiled before the run{'; an editable install or checkout' if editable else ''})"


def default_pipguard() -> List[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "pipguard")
    if os.path.exists(beside):
        return [beside]
    found = shutil.which("pipguard")
    return [found] if found else [sys.executable, "-m", "pipguard"]


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring verbatim, and each option's default."""


def parse_args(argv: Optional[Sequence[str]] = None):
    p = argparse.ArgumentParser(
        prog="benchmarks/bench.py",
        description=__doc__,
        epilog="Example: python benchmarks/bench.py --rounds 3 --json bench.json > bench.md. "
               "Packages: " + ", ".join(pk.req for pk in PACKAGES) + ". "
               "See docs/performance.md.",
        formatter_class=_HelpFormatter)
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/pipguard-bench"),
                   help="where sdists and build wheels are fetched once")
    p.add_argument("--rounds", type=int, default=3, help="timed installs per package and variant")
    p.add_argument("--json", metavar="FILE", help="also write every sample and fact as JSON here")
    p.add_argument("--packages", metavar="NAME,...",
                   help="only these packages of the pinned set (none given: all)")
    p.add_argument("--variants", default="plain,install,install-os",
                   help="install variants to run, of " + ",".join(ALL_VARIANTS) + " (install is "
                        "skipped when 'pipguard install' does not exist; audit,os,full only on "
                        "the local route)")
    p.add_argument("--routes", default="local,index",
                   help="where pip gets the packages: local (--no-index --find-links CACHE), "
                        "index (a loopback PEP 503 index with credentials in PIP_INDEX_URL)")
    p.add_argument("--write-bytecode", action="store_true",
                   help="do not set PYTHONDONTWRITEBYTECODE=1 (pip 23.2's build-env "
                        "sitecustomize then writes __pycache__ in the read-only build env: see "
                        "docs/performance.md)")
    p.add_argument("--startup-n", type=int, default=20, help="runs per start-up command")
    p.add_argument("--opens", type=int, default=20000, help="open() calls in the per-event workloads (Python and C)")
    p.add_argument("--hook-reps", type=int, default=5, help="runs per layer of the hook workloads")
    p.add_argument("--skip", default="", metavar="SECTION,...",
                   help="skip sections: installs, startup, hook (hook includes the native opens)")
    p.add_argument("--fetch-only", action="store_true", help="fill the cache and stop")
    p.add_argument("--profile", metavar="PKG",
                   help="instead of benchmarking: one sandboxed build of PKG with the "
                        "pipguard process under cProfile; prints the top functions")
    p.add_argument("--profile-top", type=int, default=25)
    p.add_argument("--profile-variant", default="full", choices=[v for v in ALL_VARIANTS if v != "plain"],
                   help="which sandboxed variant --profile runs")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for the venvs and the workloads")
    p.add_argument("--pipguard", help="pipguard command (default: beside this Python, or on PATH)")
    p.add_argument("--pipguard-tree", metavar="TEXT",
                   help="what the report says pipguard's tree is (default: the git state of the "
                        "checkout this script is in; say so when --pipguard is another copy)")
    p.add_argument("--workdir", default="/tmp",
                   help="where fresh venvs and work dirs go; must not be in a home directory")
    p.add_argument("--keep-work", action="store_true", help="keep every venv and log")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    packages = list(PACKAGES)
    if args.packages:
        wanted = {n.strip().lower() for n in args.packages.split(",") if n.strip()}
        unknown = wanted - {p.name for p in PACKAGES}
        if unknown:
            raise SystemExit(f"bench: unknown package(s): {', '.join(sorted(unknown))}")
        packages = [p for p in PACKAGES if p.name in wanted]
    pipguard = args.pipguard.split() if args.pipguard else default_pipguard()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    need_dist = args.profile or "installs" not in skip or args.fetch_only
    dist = fetch(os.path.abspath(args.cache), packages if not args.profile else PACKAGES,
                 args.python) if need_dist else ""
    if args.fetch_only:
        log(f"cache ready: {dist}")
        return 0
    bench = Bench(args, dist, pipguard)
    try:
        bench.make_template()
        if args.profile:
            pkg = next((p for p in PACKAGES if p.name == args.profile.lower()), None)
            if pkg is None:
                raise SystemExit(f"bench: unknown package {args.profile}")
            print(bench.profile(pkg, args.profile_top, args.profile_variant))
            return 0
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        bad = set(variants) - set(ALL_VARIANTS)
        if bad:
            raise SystemExit(f"bench: unknown variant(s): {', '.join(sorted(bad))}")
        if "plain" not in variants:
            variants.insert(0, "plain")
        if bench.install_cmd is None:
            variants = [v for v in variants if not v.startswith("install")]
        if "install" in variants:
            headline, label = "install", "pipguard install --sandbox"
        else:
            headline, label = "full", "pipguard run (install command not available)"
        routes = [r.strip() for r in args.routes.split(",") if r.strip()]
        if set(routes) - set(ROUTES):
            raise SystemExit(f"bench: unknown route(s): {', '.join(sorted(set(routes) - set(ROUTES)))}")
        result: dict = {"schema": "pipguard.bench/2", "rounds": args.rounds,
                        "hook_reps": args.hook_reps, "variants": variants,
                        "headline": {"variant": headline, "label": label},
                        "machine": {**machine_facts(args.python, pipguard),
                                    "pipguard_package": compile_pipguard(pipguard),
                                    **({"pipguard_tree": args.pipguard_tree} if args.pipguard_tree
                                       else {})},
                        "env": {"PYTHONDONTWRITEBYTECODE": bench.env.get("PYTHONDONTWRITEBYTECODE"),
                                "PIP_CONFIG_FILE": bench.env["PIP_CONFIG_FILE"]},
                        "packages": [p.__dict__ for p in packages],
                        "build_wheels": list(BUILD_WHEELS)}
        log(f"sandboxed installs: {label}; work dir {bench.root}")
        if "startup" not in skip:
            log("start-up")
            result["startup"] = bench.startup()
        if "hook" not in skip:
            log("per-event cost")
            result["hook"] = bench.hook_cost()
        if "installs" not in skip:
            t0 = time.time()
            result["machine"]["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
            samples = bench.installs(packages, variants, routes)
            result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
            result["routes"] = {r: summarize(samples, packages,
                                             [v for v in variants
                                              if not (r != "local" and v in RUN_VARIANTS)], r)
                                for r in routes}
            result["installs_wall_s"] = round(time.time() - t0, 1)
            result["samples"] = [s.__dict__ for s in samples]
        text = markdown(result, packages, variants, headline, label)
        print(text)
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(result, fh, indent=2)
            os.replace(tmp, args.json)
        return 0
    finally:
        if not args.keep_work:
            shutil.rmtree(bench.root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

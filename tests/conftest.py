"""Shared fixtures for pipguard's tests.

Safety rules every fixture here enforces:
- HOME is a throw-away directory with planted FAKE secrets (``fake_home``); real ones are never read.
- Network only on loopback, to listeners a fixture starts and stops (``loopback_tcp`` ...).
- The package index is used once per session, to fill the ``wheelhouse`` cache; builds run with
  ``--no-index --find-links <wheelhouse>`` and with this machine's pip config neutralised.
- Tests needing a kernel feature are gated by probed capabilities (``support.requires_*``); with
  ``PIPGUARD_REQUIRE_ALL_LAYERS=1`` a missing capability fails instead of skipping.
"""
from __future__ import annotations

import contextlib
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pg  # noqa: E402
import support  # noqa: E402
from support import gates as _caps  # noqa: E402

# As root, every sandbox runs as its own uid, granted traversal of the test's tmp_path ancestors
# by ACL entries. A pytest session *starting* chmods the shared /tmp/pytest-of-<user> to 0700 when
# its mode shows group bits (which an ACL mask does), and a chmod narrows the mask: the sandboxes
# of a concurrent session lose their grant mid-run. Each session gets a private temp root instead
# (removed when the session passes; kept for a look when it fails).
_PRIVATE_TEMPROOT = None
if os.geteuid() == 0 and "PYTEST_DEBUG_TEMPROOT" not in os.environ:
    _PRIVATE_TEMPROOT = tempfile.mkdtemp(prefix="pytest-private-")  # no "pipguard": tests match that name in paths
    os.environ["PYTEST_DEBUG_TEMPROOT"] = _PRIVATE_TEMPROOT


_CLOCK = {"start": time.monotonic()}  # the session's moments, for the wall time's parts (tiers below)


def pytest_sessionfinish(session, exitstatus):
    _CLOCK["tests"] = time.monotonic()
    if _PRIVATE_TEMPROOT and exitstatus == 0:
        # Hundreds of venvs: removing them here took 48 s of a 675 s run. Renamed (nothing
        # finds it by its old name), then removed by an `rm -rf` that outlives the session.
        doomed = _PRIVATE_TEMPROOT + ".removing"
        try:
            os.rename(_PRIVATE_TEMPROOT, doomed)
            subprocess.Popen(["rm", "-rf", "--", doomed], start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            shutil.rmtree(_PRIVATE_TEMPROOT, ignore_errors=True)
    _CLOCK["removed"] = time.monotonic()


# --- tiers ---------------------------------------------------------------------------------------
# Every test is in exactly one tier (docs/testing.md): `pytest -m unit` is the quick loop,
# `python -m pytest` runs them all. The one place tiers are assigned: TIERS names each test
# module's tier; a test using a fixture of a costlier tier (TIER_FIXTURES) is lifted to that tier,
# so a mixed module's pure tests stay in its own; TIER_OVERRIDES names single tests (node id
# without parameters) where neither says it. A module missing from TIERS is tiered by its fixtures
# alone, and tests/test_tiers.py fails until it is added here.
TIER_ORDER = ("unit", "sandbox", "install", "slow")
TIERS = {
    # unit: in this process, no process spawned (checked: see _UnitSpawnGuard), seconds.
    "test_attack_gate": "unit",  # its tests that need pip are lifted to install by their fixtures
    "test_cli_fastpath": "unit",
    "test_gate": "unit",
    "test_gate_cache": "unit",
    "test_srcguard_tree": "unit",
    "test_hook_perf_semantics": "unit",
    "test_idle_work": "unit",
    "test_layout": "unit",
    "test_lint": "unit",
    "test_protections": "unit",
    "test_render": "unit",
    "test_render_safe": "unit",
    "test_tiers": "unit",
    "test_tempdirs": "sandbox",
    "test_wheelpaths": "unit",
    # sandbox: real sandboxed processes (pipguard run, the API, the OS layer on the kernel).
    "test_api_citizen": "sandbox",
    "test_audit_layer": "sandbox",
    "test_cgroup_sweep": "sandbox",
    "test_cli": "sandbox",
    "test_evidence": "sandbox",
    "test_hook_bytecode": "sandbox",
    "test_host_doctor": "sandbox",  # the host's probes and doctor's checks run children
    "test_launcher_spare": "sandbox",
    "test_lifetime": "sandbox",
    "test_ns_backend": "sandbox",
    "test_os_layer_e2e": "sandbox",
    "test_parallel": "sandbox",  # pytest-xdist: shared leases, the summary of a run with workers
    "test_oslayer": "sandbox",
    "test_responder": "sandbox",
    "test_rules": "sandbox",
    "test_sandbox_user": "sandbox",
    "test_seam_handoff": "sandbox",
    # install: the real pip, sdists built here, pipguard install.
    "test_action": "install",
    "test_approvals": "install",
    "test_corpus": "install",
    "test_filemodes": "install",
    "test_index_proxy": "install",
    "test_install": "install",
    "test_install_attacks": "install",
    "test_install_ns": "install",
    "test_install_project_tree": "install",
    "test_install_seam": "install",
    "test_install_wheel_truth": "install",
    "test_limits_usage": "install",
    "test_terminal_output": "install",
    "test_write_limit": "install",
    # slow: a VM under TCG, makepkg, the real ecosystem's build backends.
    "test_ecosystem": "slow",
    "test_pkgbuild": "slow",
    "test_vm_backend": "slow",
}
TIER_FIXTURES = {
    "sandbox": {"fake_home", "fake_home_factory", "backend", "try_one_bin", "try_one_py", "nobody_python",
                "nobody_setup", "enforcer"},
    "install": {"wheelhouse", "target", "any_pip_target", "route", "links", "sdists", "corpus_sdist"},
    "slow": {"makepkg", "buildtools"},
}
TIER_MARKERS = {"network_index": "slow"}  # a test needing the real package index is slow
TIER_OVERRIDES = {  # "test_module::test_name" (no parameters) -> tier
    "test_srcguard_tree::test_a_hooks_directory_nested_past_the_recursion_limit_is_refused_and_removed": "sandbox",
    "test_gate::test_setuptools_editable_finder_is_informational_for_its_project": "install",  # runs the real
    "test_gate::test_setuptools_editable_path_line_is_informational_for_its_project": "install",  # build backend
    "test_gate::test_editables_bootstrap_is_informational_for_its_project": "install",
    "test_protections::test_a_real_runs_report_matches_what_the_kernel_applied": "sandbox",
    "test_protections::test_every_name_the_layers_use_is_in_the_table": "sandbox",  # runs `true`
    "test_render_safe::test_relay_copies_filtered_output_into_the_target_pipe_until_every_writer_is_gone": "sandbox",
    "test_tiers::test_the_unit_guard_sees_a_process_started": "sandbox",
    "test_tiers::test_the_matrix_keeps_both_values_and_pips_per_test_and_every_pair_in_the_suite": "sandbox",
}
UNKNOWN_MODULE_TIER = "sandbox"  # a new module with none of TIER_FIXTURES: not promised to be quick


def tier_of(module: str, test_name: str, fixtures, markers) -> str:
    """The tier of one test: an override, else the costliest of its module's and its fixtures'."""
    override = TIER_OVERRIDES.get(f"{module}::{test_name}")
    if override:
        return override
    ranks = [TIER_ORDER.index(TIERS.get(module, UNKNOWN_MODULE_TIER))]
    ranks += [TIER_ORDER.index(t) for t, names in TIER_FIXTURES.items() if names & set(fixtures)]
    ranks += [TIER_ORDER.index(t) for m, t in TIER_MARKERS.items() if m in markers]
    if module not in TIERS and len(ranks) > 1:
        ranks.pop(0)  # unknown module: its fixtures decide
    return TIER_ORDER[max(ranks)]


# --- the pip matrix ------------------------------------------------------------------------------
# A test taking `any_pip_target` (support.pipinstall.PIPS) and a two-valued axis of its own (the
# `route`: index, find-links; test_install_project_tree's `how`: loud, quiet) runs on two of the
# four pairs, not all four: each pip once and each value once (pairwise testing). Which two
# alternates from test to test (a hash of its name and its other parameters, stable across runs and
# machines), so the suite still runs every pair: tests/test_tiers.py checks both. A bug that only
# one route *with* one pip shows is then caught by about half of these tests, not all;
# PIPGUARD_FULL_MATRIX=1 runs all four pairs (before a release, or to chase such a bug).
PAIRED_WITH_PIP = {"route": ("index", "find-links"), "how": ("loud", "quiet")}
FULL_MATRIX = os.environ.get("PIPGUARD_FULL_MATRIX") == "1"


def matrix_pairs(key: str, values) -> frozenset:
    """The (value, pip) pairs a test runs on: both values, both pips, paired by ``key``."""
    import zlib

    from support.pipinstall import PIPS

    flip = zlib.crc32(key.encode()) & 1
    return frozenset({(values[0], PIPS[flip]), (values[1], PIPS[1 - flip])})


def matrix_key(test: str, params: dict, axis: str) -> str:
    """A test's name and its parameters other than the pip and the axis paired with it."""
    rest = sorted(f"{k}={v}" for k, v in params.items() if k not in (axis, "any_pip_target"))
    return "::".join([test, *rest])


def _off_the_matrix(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if FULL_MATRIX or "any_pip_target" not in params:
        return False
    for axis, values in PAIRED_WITH_PIP.items():
        if axis in params:
            key = matrix_key(item.nodeid.partition("[")[0], params, axis)
            return (params[axis], params["any_pip_target"]) not in matrix_pairs(key, values)
    return False


def pytest_collection_modifyitems(config, items):
    dropped = [item for item in items if _off_the_matrix(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not _off_the_matrix(item)]
    for item in items:
        module = item.module.__name__ if item.module else item.path.stem
        name = getattr(item, "originalname", None) or item.name
        markers = {m.name for m in item.iter_markers()}
        item.add_marker(getattr(pytest.mark, tier_of(module, name, item.fixturenames, markers)))
    if hasattr(config, "workerinput"):
        # pytest-xdist: the costliest tier first (longest-first scheduling), so that the VM and
        # install tests do not end the run on one worker while the other has nothing left to
        # take; within a tier, the collection's order. Every worker sorts the same way, as
        # xdist requires of their collections.
        cost = {tier: -rank for rank, tier in enumerate(TIER_ORDER)}
        items.sort(key=lambda item: min(cost[t] for t in TIER_ORDER if item.get_closest_marker(t)))


class _UnitSpawnGuard:
    """A unit test promises no process: an audit hook (this process's only one of ours) notes each
    process a unit test starts, and the test fails naming it (move the test to a costlier tier)."""

    EVENTS = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.system", "os.exec", "pty.spawn"}

    def __init__(self):
        self.watching = False
        self.seen: list = []
        sys.addaudithook(self._hook)

    def _hook(self, event, args):
        if self.watching and event in self.EVENTS:
            self.seen.append(f"{event} {args[:2]!r}"[:200])


_unit_guard = _UnitSpawnGuard()
_UNIT_MAY_SPAWN = {"test_lint"}  # the linters are processes, not sandboxes


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    watch = item.get_closest_marker("unit") is not None and item.path.stem not in _UNIT_MAY_SPAWN
    if watch:
        from pipguard.sandbox import host
        from pipguard.sandbox.backends import ns

        host.probe(), ns.probe()  # the kernel probed once per process, in children: not the test's doing
    _unit_guard.watching, _unit_guard.seen = watch, []
    try:
        result = yield
    finally:
        _unit_guard.watching = False
    if _unit_guard.seen:
        pytest.fail("a unit-tier test started a process (tier it in tests/conftest.py TIERS/TIER_OVERRIDES): "
                    + "; ".join(_unit_guard.seen[:3]), pytrace=False)
    return result


def pytest_collection_finish(session):
    _CLOCK["collected"] = time.monotonic()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under pytest-xdist the controller collects nothing itself: collection ends when the last
    worker's does."""
    _CLOCK["collected"] = time.monotonic()
    _CLOCK["workers"] = _CLOCK.get("workers", 0) + 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Per tier: how many tests passed, failed, were skipped, and the seconds they took; then the
    wall time. CI's log says which tiers ran (a tier with nothing run is named as not run)."""
    outcomes: dict = {t: Counter() for t in TIER_ORDER}
    seconds: Counter = Counter()
    seen: dict = {}
    for category, reports in terminalreporter.stats.items():
        for rep in reports:
            tier = next((t for t in TIER_ORDER if t in getattr(rep, "keywords", {})), None)
            if tier is None or not hasattr(rep, "when"):
                continue
            seconds[tier] += rep.duration
            if category in ("passed", "") and rep.when != "call":
                continue
            # one outcome per test: a failure or error in any phase wins over the call's pass
            key = (tier, rep.nodeid)
            if category in ("failed", "error") or key not in seen:
                seen[key] = "error" if category == "error" else category
    for (tier, _nodeid), outcome in seen.items():
        outcomes[tier][outcome] += 1
    tr = terminalreporter
    tr.section("tiers")
    expr = config.getoption("markexpr") or "(all)"
    tr.write_line(f"marker expression: {expr}")
    for tier in TIER_ORDER:
        counts = outcomes[tier]
        if not counts:
            tr.write_line(f"{tier:8} not run")
            continue
        parts = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
        tr.write_line(f"{tier:8} {parts}; {seconds[tier]:.0f} s in tests")
    now = time.monotonic()
    collected, tests, removed = (_CLOCK.get(k, now) for k in ("collected", "tests", "removed"))
    workers = _CLOCK.get("workers")  # pytest-xdist: "s in tests" add up the workers' seconds
    tr.write_line(f"wall time: {now - _CLOCK['start']:.0f} s (collection {collected - _CLOCK['start']:.0f} s, "
                  f"tests {tests - collected:.0f} s, removing the temp root {removed - tests:.0f} s)"
                  + (f"; {workers} workers (pytest-xdist)" if workers else ""))

# The corpus and helpers are data for tests, not tests (a corpus setup.py must never be imported).
collect_ignore = ["packages", "helpers"]


def pytest_configure(config):
    # A shell starts a background job (`.ci/run &` in a non-interactive script) with SIGINT
    # ignored, and an ignored signal stays ignored in every child: pipguard then rightly
    # ignores the Ctrl-C the interrupt tests send it, and they hang until their timeout.
    # The tests model a terminal user, whose Ctrl-C reaches pipguard: give them that.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _PRIVATE_TEMPROOT and not config.option.basetemp and not hasattr(config, "workerinput"):
        # <root>/t instead of <root>/pytest-of-root/pytest-0: 22 characters less in every test
        # path. A venv whose bin/ path is long gets pip's /bin/sh wrapper scripts, so
        # support.pipinstall.make_venv must make it the slow way (3-8 s, not 1): with
        # pytest-xdist's popen-gwN/ on top, most install tests' venvs crossed that line.
        config.option.basetemp = os.path.join(_PRIVATE_TEMPROOT, "t")
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its basetemp is <session's>/gwN
        from support import pipinstall

        pipinstall.SHARED_TEMPLATES = Path(config.option.basetemp).parent / "venv-templates"
    config.addinivalue_line(
        "markers",
        "requires(cap, abi=None): needs a probed capability (landlock, seccomp, seccomp_user_notif, "
        "root, userns, netns, ipv6_loopback, gcc, linux); skipped when missing, failed when "
        "PIPGUARD_REQUIRE_ALL_LAYERS=1",
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject.toml's addopts): one worker per CPU this process may run on, at
    most 8 (pytest-xdist would count psutil's physical cores where psutil is installed: one on
    a 2-vCPU runner). PYTEST_XDIST_AUTO_NUM_WORKERS still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own implementation reads it
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def pytest_report_header(config):
    strict = " (PIPGUARD_REQUIRE_ALL_LAYERS=1: missing = failure)" if _caps.strict() else ""
    return f"pipguard capabilities{strict}:\n" + _caps.describe()


def pytest_runtest_setup(item):
    for mark in item.iter_markers("requires"):
        for cap in mark.args:
            _caps.need(cap, **mark.kwargs)


# --- fake home ---------------------------------------------------------------------------------

@pytest.fixture
def work(tmp_path):
    """An empty working directory for one run: ``tmp_path/work``."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def fake_home_factory():
    """``make(owner_uid=None, owner_gid=None) -> FakeHome``; every home is removed at teardown."""
    made = []

    def make(owner_uid=None, owner_gid=None):
        fh = support.make_fake_home(owner_uid=owner_uid, owner_gid=owner_gid)
        made.append(fh)
        return fh

    yield make
    for fh in made:
        support.remove_fake_home(fh)


@pytest.fixture
def fake_home(fake_home_factory):
    """A fresh fake HOME (``FakeHome``: ``.path``, ``.secrets``, ``.markers``, ``.env()``)."""
    return fake_home_factory()


# --- as nobody ---------------------------------------------------------------------------------

def _nobody_can_run(path: str) -> bool:
    probe = support.run_as_nobody(["/bin/sh", "-c", f"test -x {path} && {path} -c 'import pipguard'"],
                                  env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""},
                                  cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return probe.returncode == 0


@contextlib.contextmanager
def nobody_runs(python: str):
    """Yield True when ``nobody`` can run ``python`` with pipguard, with search access to /root
    held for the duration (support.traversable_by: an ACL entry, counted across holders).

    The grant is taken even when nobody can already run it: that may be another holder's grant
    (a pytest-xdist worker's, a concurrent session's), gone when that holder leaves."""
    with support.traversable_by("/root", support.NOBODY):
        yield _nobody_can_run(python)


@pytest.fixture(scope="module")
def nobody_python():
    """Make this interpreter and pipguard usable by ``nobody`` for the module, then restore.

    The venv's interpreter lives under /root/.pyenv and /root is 0700: nobody needs search (not
    read) on /root, granted by an ACL entry naming nobody (support.traversable_by: a chmod would
    reset the ACL mask under concurrent root runs of pipguard). Removed at teardown.
    """
    support.need("root")
    with nobody_runs(sys.executable) as runs:
        if not runs:
            pytest.skip(f"nobody cannot run {sys.executable} with pipguard even with search access to /root")
        yield sys.executable


@pytest.fixture
def nobody_setup(fake_home_factory, nobody_python):
    home = fake_home_factory(owner_uid=support.NOBODY, owner_gid=support.NOBODY)
    base = tempfile.mkdtemp(prefix="pipguard-nobody-work-")
    os.chmod(base, 0o755)
    work = Path(base) / "work"
    work.mkdir()
    os.chown(work, support.NOBODY, support.NOBODY)
    try:
        yield home, work
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- loopback listeners ------------------------------------------------------------------------

def _listener(cls, host):
    sink = cls(host).start()
    try:
        yield sink
    finally:
        sink.stop()


@pytest.fixture
def loopback_tcp():
    """TCP listener on 127.0.0.1:<ephemeral>: ``.port``, ``.address``, ``.received`` (bytes per connection)."""
    yield from _listener(support.TcpSink, "127.0.0.1")


@pytest.fixture
def loopback_udp():
    """UDP listener on 127.0.0.1:<ephemeral>: ``.port``, ``.address``, ``.received`` (one bytes per datagram)."""
    yield from _listener(support.UdpSink, "127.0.0.1")


@pytest.fixture
def build_host(tmp_path):
    """A loopback HTTP server serving ``crate.txt`` (``support.BuildHost.CONTENT``), as a crate
    or Go module host: ``.port``."""
    host = support.BuildHost(tmp_path / "served").start()
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture
def loopback_tcp6():
    """Like ``loopback_tcp`` on ``::1``; skipped when ::1 is unusable."""
    support.need("ipv6_loopback")
    yield from _listener(support.TcpSink, "::1")


@pytest.fixture
def loopback_udp6():
    """Like ``loopback_udp`` on ``::1``; skipped when ::1 is unusable."""
    support.need("ipv6_loopback")
    yield from _listener(support.UdpSink, "::1")


# --- launch backends ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def makepkg():
    """The real makepkg (tests/test_pkgbuild.py, the VM backend's pkgbuild test)."""
    from support.pkgbuilds import need_makepkg

    need_makepkg()


@pytest.fixture
def pkgdir():
    """``pkgdir(text, files=None)``: a PKGBUILD directory, removed afterwards."""
    from support.pkgbuilds import make_pkgdir

    made = []

    def make(text, files=None):
        made.append(make_pkgdir(text, files))
        return made[-1]

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=pg.BACKEND_PARAMS)
def backend(request):
    """Each launch backend (``pg.Backend``: plain, ns) in turn. To run only some cases of a
    parametrized test under ns: ``@pytest.mark.parametrize("x, backend", [pg.backend_param("plain",
    1), pg.backend_param("ns", 1), ...], indirect=["backend"])``."""
    return pg.Backend(request.param)


# --- builds --------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """Directory of pinned build wheels (``support.PINS``), downloaded once and cached; use with
    ``--no-index --find-links``. Skips if it cannot be filled (fails under PIPGUARD_REQUIRE_ALL_LAYERS=1)."""
    try:
        return support.ensure_wheelhouse()
    except support.WheelhouseUnavailable as exc:
        msg = f"offline wheelhouse unavailable: {exc}"
        if _caps.strict():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def buildtools() -> Path:
    """The real ecosystem's build backends as wheels (meson-python, maturin, flit-core,
    hatchling... : support.buildtools), fetched once into the test cache. Skips if they cannot
    be had (fails under PIPGUARD_REQUIRE_ALL_LAYERS=1)."""
    from support.buildtools import BuildToolsUnavailable, ensure

    try:
        return ensure()
    except BuildToolsUnavailable as exc:
        if _caps.strict():
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture
def corpus_sdist(tmp_path):
    """``make(name) -> Path``: a real sdist of ``tests/packages/<name>`` built in ``tmp_path/sdists``."""
    def make(name):
        return support.build_sdist(support.project(name), tmp_path / "sdists")
    return make


# --- try-one-action helper -----------------------------------------------------------------------

@pytest.fixture(scope="session")
def try_one_bin() -> Path:
    """``tests/helpers/try_one.c`` compiled once per session into a 0o755 temp dir outside pytest's
    0o700 basetemp, so ``run_as_nobody`` can execute it too."""
    support.need("gcc")
    out = tempfile.mkdtemp(prefix="pipguard-try-one-")
    os.chmod(out, 0o755)
    try:
        yield support.compile_try_one(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="session")
def try_one_py() -> list:
    """argv prefix running ``tests/helpers/try_one.py`` with this interpreter (``-I``)."""
    return support.try_one_py_argv()


# --- pipguard install ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def sdists(tmp_path_factory):
    """Real sdists of the install corpus (tests/packages), built once per session, and
    ``light_pure``: a clean one-module flit_core project, the dependency of tests whose subject
    is not the build backend (extras, requirements files, --target): its build costs a fraction
    of setuptools' (support.projects.write_flit_project)."""
    from support import build_sdist
    from support.corpus import project
    from support.pipinstall import CORPUS
    from support.projects import write_flit_project

    out = tmp_path_factory.mktemp("sdists")
    for name in CORPUS:
        build_sdist(project(name), out)
    build_sdist(write_flit_project(tmp_path_factory.mktemp("light"), "light_pure", "0.1.0"), out)
    return out


@pytest.fixture
def target(tmp_path, wheelhouse):
    """A fresh target venv with its bundled pip."""
    from support.pipinstall import make_venv

    return make_venv(tmp_path / "target", "bundled", wheelhouse)


@pytest.fixture(params=["bundled", "26.3"])
def any_pip_target(request, tmp_path, wheelhouse):
    """A fresh target venv with each tested pip (support.pipinstall.PIPS)."""
    from support.pipinstall import make_venv

    return make_venv(tmp_path / "target", request.param, wheelhouse)


@pytest.fixture(params=["index", "find-links"])
def route(request, wheelhouse, sdists):
    """Both routes users run: a loopback index (credentials in PIP_INDEX_URL) and --find-links."""
    from support.pipinstall import Route

    r = Route(request.param, [wheelhouse, sdists])
    yield r
    r.stop()


@pytest.fixture
def links(wheelhouse, sdists):
    """The find-links route only (tests about one behaviour, not about the route)."""
    from support.pipinstall import Route

    r = Route("find-links", [wheelhouse, sdists])
    yield r
    r.stop()

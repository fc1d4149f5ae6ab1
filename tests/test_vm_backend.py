"""The VM backend (``--isolation vm``, pipguard/sandbox/vm/), under TCG.

Few and slow on purpose: every test here boots a real QEMU guest (software
emulation: ~20-50 s each on a loaded 2-vCPU host; the sdist install boots one
per hook call). They need qemu-system-x86,
a /boot kernel with its modules and busybox-static (``.ci/run`` installs them);
missing, they skip (fail under PIPGUARD_REQUIRE_ALL_LAYERS=1).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from pipguard.sandbox.vm import qemu, tools
from pipguard.sandbox.vm import runner as vm
from pipguard.errors import LayerUnavailable, PolicyError
from pipguard.sandbox.policy import Policy
import support
from support import gates, requires
from support.env import clean_env
from support.pkgbuilds import review

_tools, _parts = tools.find_tools()
_missing = "; ".join(f"{p.name}: {p.reason}" for p in _parts if p.reason)


@pytest.fixture(autouse=True)
def _needs_vm_tools():
    if _tools is None:
        if gates.strict():
            pytest.fail(f"the VM backend's tools are missing: {_missing}")
        pytest.skip(f"the VM backend's tools are missing: {_missing}")


def _pipguard(args, cwd, home, timeout=600, prelude=None):
    """``pipguard ARGS`` in a child Python; ``prelude``: the guest init's unsafe
    test prelude (the CLI has no such option: it is patched into vm.run)."""
    code = "import sys; from pipguard.cli.app import main; sys.argv[0] = 'pipguard'; main()"
    if prelude is not None:
        code = ("import functools; import pipguard.sandbox.vm.runner as v; "
                f"v.run = functools.partial(v.run, unsafe_guest_prelude={prelude!r}); " + code)
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=clean_env(home),
                          capture_output=True, text=True, timeout=timeout)


GUEST_LOOK = r"""
import errno, json, os, socket, sys
marker, secret, port = sys.argv[1][::-1], sys.argv[2], int(sys.argv[3])  # reversed: not in our own argv
seen = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            line = fh.read().replace(b"\0", b" ").decode()
    except OSError:
        continue
    if line:  # kernel threads have none
        seen.append(line)
try:
    open(secret).close(); secret_result = "read"
except OSError as exc:
    secret_result = errno.errorcode[exc.errno]
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", port)); net = "connected"
except OSError as exc:
    net = errno.errorcode.get(exc.errno, str(exc))
out = {"marker_seen": any(marker in c for c in seen), "processes": len(seen),
       "secret": secret_result, "shadow": os.path.exists("/etc/shadow"),
       "home_dir": os.path.exists(os.path.dirname(secret)),
       "interfaces": sorted(os.listdir("/sys/class/net")), "net": net}
with open("look.json", "w") as fh:
    json.dump(out, fh)
try:  # setuid, setgid, world-writable: what a guest must not leave on the host
    os.chmod("look.json", 0o6777)
except PermissionError:  # the OS layer refuses setuid/setgid bits in the kernel (reported)
    os.chmod("look.json", 0o777)
print("looked")
"""


def test_guest_sees_no_host_process_no_file_outside_its_shares_no_network(tmp_path, fake_home,
                                                                          loopback_tcp):
    build = tmp_path / "build"
    build.mkdir()
    (build / "look.py").write_text(GUEST_LOOK)
    marker = f"pipguard-vm-host-marker-{os.getpid()}"
    host_process = subprocess.Popen(["bash", "-c", f"exec -a {marker} sleep 600"])
    secret = str(fake_home.secrets["id_rsa"])
    try:
        assert os.path.exists(secret)
        time.sleep(0.2)
        with open(f"/proc/{host_process.pid}/cmdline", "rb") as fh:
            assert fh.read().startswith(marker.encode())  # visible on the host
        result = _pipguard(["run", "--isolation", "vm", "--vm-accel", "tcg", "--report", str(tmp_path / "r.json"),
                            "--", sys.executable, "look.py", marker[::-1], secret, str(loopback_tcp.port)],
                           cwd=build, home=fake_home.path)
    finally:
        host_process.kill()
        host_process.wait()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "looked" in result.stdout  # the command's stdout came back over its own port
    look = json.loads((build / "look.json").read_text())  # written through the read-write share
    assert look["marker_seen"] is False and look["processes"] < 15
    # ENOENT, not EACCES: the home is not in the VM at all (Landlock would say EACCES)
    assert look["secret"] == "ENOENT" and look["home_dir"] is False
    assert look["shadow"] is False  # the guest's /etc is a copy without the plan's secrets
    assert look["interfaces"] == ["lo"]  # no network device
    assert look["net"] != "connected" and loopback_tcp.received == []
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["isolation"]["requested"] == "vm"
    assert {"vm", "audit", "landlock.fs", "seccomp"} <= set(report["isolation"]["applied"])
    assert report["vm"]["accel"] == "tcg" and report["vm"]["guest_report"] is True
    # the layers inside the guest saw (and refused) the connection: failed AND reported
    assert any(e["kind"] == "network" and e["action"] == "blocked" for e in report["events"]), report["events"]
    assert report["verdict"] == "blocked"
    # the guest's permission bits reach the host after the run, as the plain backend leaves a
    # root run's files: without setuid, setgid and world-write (the test runs as root)
    assert (build / "look.json").stat().st_mode & 0o7777 == (0o775 if os.geteuid() == 0 else 0o6777)
    assert not [n for n in os.listxattr(build / "look.json") if n.startswith("user.virtfs.")]


def test_timeout_kills_the_vm_and_the_report_is_written(tmp_path, fake_home):
    started = time.monotonic()
    result = _pipguard(["run", "--isolation", "vm", "--vm-accel", "tcg", "--timeout", "15",
                        "--report", str(tmp_path / "r.json"), "--", "sleep", "600"],
                       cwd=tmp_path, home=fake_home.path)
    took = time.monotonic() - started
    assert result.returncode == 124, result.stderr[-2000:]
    assert took < 15 + 60
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["timed_out"] is True and report["exit_code"] is None
    assert report["vm"]["qemu_exit"] == -9  # pipguard killed QEMU itself
    assert report["vm"]["guest_report"] is False


def test_a_guest_kernel_crash_gives_exit_2_and_the_console_tail(tmp_path, fake_home):
    result = _pipguard(["run", "--isolation", "vm", "--vm-accel", "tcg", "--timeout", "300",
                        "--report", str(tmp_path / "r.json"), "--", "true"],
                       cwd=tmp_path, home=fake_home.path, prelude="echo c > /proc/sysrq-trigger")
    assert result.returncode == 2, result.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "error" and "kernel crashed" in report["error"]
    tail = "\n".join(report["vm"]["console_tail"])
    assert "sysrq" in tail.lower() and "Kernel panic" in tail, tail


def test_without_working_kvm_vm_exits_2_with_the_reason(tmp_path, fake_home):
    kvm = next(p for p in qemu.probe().parts if p.name == "kvm")
    if kvm.ok:
        pytest.skip("KVM works here: the refusal path cannot be provoked")  # GitHub runners
    result = _pipguard(["run", "--isolation", "vm", "--", "true"], cwd=tmp_path, home=fake_home.path)
    assert result.returncode == 2
    assert "KVM does not work here" in result.stderr and "--vm-accel tcg" in result.stderr
    with pytest.raises(LayerUnavailable, match="KVM"):
        vm.run(["true"], Policy(isolation="vm"), cwd=str(tmp_path))
    doctor = _pipguard(["doctor", "--format", "json"], cwd=tmp_path, home=fake_home.path)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["vm.kvm"]["status"] == "degraded" and checks["vm.qemu"]["status"] == "ok"


def test_vm_policy_settings_are_checked(tmp_path):
    with pytest.raises(PolicyError, match="vm_accel"):
        Policy(isolation="vm", vm_accel="hvf")
    with pytest.raises(LayerUnavailable, match="no full network"):
        vm.run(["true"], Policy(isolation="vm", vm_accel="tcg", allow_network=True), cwd=str(tmp_path))


GUEST_FETCH = r"""
import errno, json, os, socket, sys, urllib.error, urllib.request
allowed, denied = sys.argv[1], sys.argv[2]
out = {"proxy": os.environ.get("HTTP_PROXY")}
out["allowed"] = urllib.request.urlopen(allowed, timeout=120).read().decode()
try:
    urllib.request.urlopen(denied, timeout=120).read()
    out["denied"] = "read"
except urllib.error.HTTPError as exc:
    out["denied"] = exc.code
host, port = allowed.split("/")[2].split(":")
s = socket.socket()
s.settimeout(5)
try:
    s.connect((host, int(port))); out["direct"] = "connected"
except OSError as exc:
    out["direct"] = errno.errorcode.get(exc.errno, str(exc))
with open("fetch.json", "w") as fh:
    json.dump(out, fh)
"""

# as the guest's root, before pipguard starts in the guest (no sandbox at all):
# the VM itself has no route to the host, neither to QEMU's usual host alias
# (10.0.2.2 under user-mode networking) nor to the host's loopback
GUEST_ROUTES = ("for t in 10.0.2.2 127.0.0.1; do "
                "if echo x | $BB nc -w 3 $t {port}; then echo pg-direct-$t-connected; "
                "else echo pg-direct-$t-failed; fi; done")


def test_build_hosts_only_through_the_host_proxy(tmp_path, fake_home, loopback_tcp, build_host):
    """--allow-host under vm: the allowed loopback server is reached through the host's filtering
    proxy over the VM's relay; a host not allowed is refused by that proxy and reported (quiet: a
    direct connect from the sandbox; loud: a proxied request), and the guest has no other route."""
    port = build_host.port
    build = tmp_path / "build"
    build.mkdir()
    (build / "fetch.py").write_text(GUEST_FETCH)
    result = _pipguard(["run", "--isolation", "vm", "--vm-accel", "tcg", "--allow-host", f"127.0.0.1:{port}",
                        "--report", str(tmp_path / "r.json"), "--", sys.executable, "fetch.py",
                        f"http://127.0.0.1:{port}/crate.txt", f"http://127.0.0.1:{loopback_tcp.port}/x"],
                       cwd=build, home=fake_home.path, prelude=GUEST_ROUTES.format(port=port))
    assert result.returncode == 0, result.stderr[-3000:]
    fetched = json.loads((build / "fetch.json").read_text())
    assert fetched["proxy"].startswith("http://127.0.0.1:")  # the guest's relay, set by the guest's plan
    assert fetched["allowed"] == build_host.CONTENT.decode()
    assert fetched["denied"] == 403 and loopback_tcp.received == []  # failed, nothing reached it
    assert fetched["direct"] != "connected"
    report = json.loads((tmp_path / "r.json").read_text())
    tail = "\n".join(report["vm"]["console_tail"])
    assert "pg-direct-10.0.2.2-failed" in tail and "pg-direct-127.0.0.1-failed" in tail, tail
    assert report["vm"]["network"]["channel"] == "virtio-serial"
    assert report["vm"]["network"]["connections"] >= 2
    events = report["events"]
    proxied = {(e["target"], e["action"]) for e in events if e["layer"] == "proxy"}
    # each proxied request is attributed to the guest process that made it (the host relay's stream
    # -> the guest relay's connection -> the guest supervisor's connection for it), not a made-up 0
    fetcher = [p["pid"] for p in report["processes"] if "fetch.py" in " ".join(p["argv"])]
    assert len(fetcher) == 1 and fetcher[0] > 0, report["processes"]
    assert set(report["supervision"]["proxy_clients"].values()) == set(fetcher), report["supervision"]
    assert all(e["pid"] == fetcher[0] and e["detail"]["pid"].startswith("in the guest")
               for e in events if e["layer"] == "proxy"), events
    assert {n["pid"] for n in report["network"] if n["layer"] == "proxy"} == set(fetcher)
    assert (f"127.0.0.1:{port}", "allowed") in proxied, events
    assert (f"127.0.0.1:{loopback_tcp.port}", "blocked") in proxied, events  # loud: reported
    # quiet: the sandbox's own connect, refused and reported by the guest's supervisor
    assert any(e["kind"] == "network" and e["action"] == "blocked" and e["layer"] != "proxy"
               and e["target"] == f"127.0.0.1:{port}" for e in events), events
    network = {(n["address"], n["port"], n["action"]) for n in report["network"]}
    assert ("127.0.0.1", port, "allowed") in network and ("127.0.0.1", loopback_tcp.port, "blocked") in network
    assert report["verdict"] == "blocked"


def test_sdist_install_runs_each_hook_call_in_a_vm(tmp_path, fake_home, links, target):
    """install --sandbox --isolation vm: pip's hook calls for a real sdist, each in a guest of
    its own (docs/sandbox.md, "VM backend": per hook call), and the package is installed. A
    flit_core sdist (light_pure): the same three hook calls and boots as a setuptools one, without
    setuptools' import under emulation in each (75 s for legit_pure in CI)."""
    from support.pipinstall import pg_install, site_import

    started = time.monotonic()
    proc, report = pg_install(["--isolation", "vm", "--vm-accel", "tcg", "light_pure"], home=fake_home,
                              target=target, route=links, cwd=tmp_path, timeout=1800)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert site_import(target, "light_pure").returncode == 0
    phases = [(p["name"], p["duration"]) for p in report["phases"]]
    assert "build_wheel" in [name for name, _ in phases], phases
    assert "vm" in report["isolation"]["applied"] and "vm.kvm" in report["isolation"]["unavailable"]
    print(f"vm install: {took:.1f} s, phases {phases}")  # the figures in docs/sandbox.md


@requires("root")
def test_vm_as_nobody(nobody_setup):  # noqa: F811 (the imported fixture)
    """Unprivileged: QEMU under TCG needs no /dev/kvm and no privilege; the report says nobody ran it."""
    home, work = nobody_setup
    report_path = work / "r.json"
    from support.users import run_as_nobody

    result = run_as_nobody([sys.executable, "-m", "pipguard", "run", "--isolation", "vm", "--vm-accel", "tcg",
                            "--report", str(report_path), "--", sys.executable, "-c",
                            "import os; open('made.txt', 'w').write(str(os.getuid()))"],
                           cwd=work, env=home.env(), capture_output=True, text=True, timeout=600)
    assert report_path.exists(), result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert result.returncode == 0, (result.stderr[-3000:], report["vm"].get("console_tail"),
                                    report["vm"].get("qemu_stderr"))
    assert report["host"]["euid"] == 65534
    assert "vm" in report["isolation"]["applied"] and report["vm"]["guest_report"] is True
    # the guest's pipguard switched from guest root to 65534 and kept its supervisor: a uid
    # change clears the dumpable flag, then pidfd_getfd of the listener is EPERM and every
    # notified syscall (the exec first) failed with ENOSYS
    assert "supervisor" not in report["isolation"]["unavailable"], report["isolation"]
    made = work / "made.txt"
    assert made.read_text() == "65534"  # in the guest too, pipguard runs as the host user's uid
    assert made.stat().st_uid == 65534  # on the host: a file of nobody's, written by nobody's QEMU


def test_auto_never_picks_vm(tmp_path):
    from pipguard.sandbox import run

    report = run(["true"], Policy(), cwd=str(tmp_path))
    assert report.exit_code == 0
    assert "vm" not in report.isolation.applied and report.vm == {}


IN_GUEST_PKGBUILD = """\
pkgname=pg-vm
pkgver=1.0
pkgrel=1
pkgdesc="pipguard test: built inside the VM's guest"
arch=('any')
license=('MIT')
build() { uname -r > kernel; id -u > uid; ls /sys/class/net > links; }
package() {
  install -Dm644 kernel "$pkgdir/usr/share/pg-vm/kernel"
  install -Dm644 uid "$pkgdir/usr/share/pg-vm/uid"
  install -Dm755 links "$pkgdir/usr/share/pg-vm/links"
  ln -s links "$pkgdir/usr/share/pg-vm/link"
}
"""


@pytest.mark.skipif(os.environ.get("PIPGUARD_TEST_SLOW_VM") != "1",
                    reason="makepkg under TCG takes 8-15 min on this 2-vCPU host (3 boots); "
                           "run with PIPGUARD_TEST_SLOW_VM=1 (CI keeps its VM tests few and fast)")
def test_pkgbuild_runs_every_phase_in_a_guest(makepkg, pkgdir, fake_home):
    """pkgbuild --isolation vm: the real makepkg of each phase in a guest of its own (no sources,
    no .install: three boots), as the build user, and each phase's guest report came back. What
    the package holds was written by makepkg in the guest: the guest kernel's release (not the
    host's), the build user's uid, only ``lo``."""
    import contextlib
    import hashlib

    from pipguard.pkgbuild import builduser

    d = pkgdir(IN_GUEST_PKGBUILD)
    with contextlib.ExitStack() as stack:
        if os.geteuid() == 0:
            # as root the review (pipguard and QEMU) runs as a dedicated build uid, and the guest
            # runs this interpreter from a share QEMU reads as that uid: a pyenv under /root must
            # be traversable for it (the first few candidates: another review may hold the first)
            for uid in builduser.CANDIDATE_IDS[:4]:
                stack.enter_context(support.traversable_by("/root", uid))
        started = time.monotonic()
        status, data, err = review(d, "--isolation", "vm", "--vm-accel", "tcg", env=fake_home.env(),
                                   timeout=1200)
        took = time.monotonic() - started
    # makepkg's own complaint comes first, pipguard's summary last
    assert status == 0, (err[:4000], err[-1500:], data and data.get("message"))
    assert data["status"] == "clean"
    phases = data["phases"]
    assert [p["name"] for p in phases] == ["srcinfo", "sources", "build"]
    for phase in phases:
        report = phase["report"]
        assert report["isolation"]["requested"] == "vm" and "vm" in report["isolation"]["applied"]
        assert report["vm"]["accel"] == "tcg" and report["vm"]["guest_report"] is True, report["vm"]
        assert "supervisor" not in report["isolation"]["unavailable"], report["isolation"]
    contents = {f["path"]: f for f in data["contents"]}
    guest_release = _tools.kernel.release
    assert contents["/usr/share/pg-vm/kernel"]["sha256"] == hashlib.sha256(f"{guest_release}\n".encode()).hexdigest()
    if guest_release != os.uname().release:  # the host runs another kernel: the build ran in the guest
        assert contents["/usr/share/pg-vm/kernel"]["sha256"] != hashlib.sha256(
            f"{os.uname().release}\n".encode()).hexdigest()
    uid = data["pkgbuild"]["build_user"]["uid"]
    assert uid != 0 and contents["/usr/share/pg-vm/uid"]["sha256"] == hashlib.sha256(f"{uid}\n".encode()).hexdigest()
    links = contents["/usr/share/pg-vm/links"]
    assert links["sha256"] == hashlib.sha256(b"lo\n").hexdigest()  # no network device
    assert links["mode"] == "0755" and contents["/usr/share/pg-vm/kernel"]["mode"] == "0644"  # the guest's modes
    # the contents come from the package archive the guest's makepkg wrote (a symlink stays one
    # there; on the read-write share it is QEMU's regular file holding its target)
    assert contents["/usr/share/pg-vm/link"]["kind"] == "symlink"
    assert contents["/usr/share/pg-vm/link"]["target"] == "links"
    print(f"pkgbuild under vm: {took:.1f} s, phases {[(p['name'], p['duration']) for p in phases]}")

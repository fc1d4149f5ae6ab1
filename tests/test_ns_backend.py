"""The namespace backend (``--isolation ns``), end to end on the real kernel:
the world inside (no outside process, only ``lo``, root-only host files
unreadable, the home a decoy tmpfs), lifetime, the decoy evidence with read
observation off, as root and as ``nobody``, and the fallback when user
namespaces are denied."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import pg
import support
from support import parse_try_one, requires
from support.probes import ATTEMPT

pytestmark = [requires("linux"), requires("userns"), requires("landlock", abi=6),
              requires("seccomp_user_notif")]

WORLD = textwrap.dedent("""
    import json, os, socket, subprocess, sys
    outside, real_home, secret = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    try:
        open(secret).read(); secret_read = "read"
    except OSError as exc:
        secret_read = exc.errno
    mounts = [l.split()[4] for l in open("/proc/self/mountinfo") if " - tmpfs " in l]
    print(json.dumps({
        "outside_visible": os.path.exists(f"/proc/{outside}"),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "links": sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]),
        "uid": os.getuid(), "hostname": socket.gethostname(),
        "secret": secret_read, "secret_owner": os.stat(secret).st_uid,
        # listed natively: the audit hook refuses (and reports) a Python look into a real home
        "home_is_tmpfs": real_home in mounts,
        "home": sorted(subprocess.run(["ls", "-A", real_home], capture_output=True, text=True).stdout.split()),
        "tmp_is_tmpfs": "/tmp" in mounts and "/dev/shm" in mounts,
    }))
""")


def _setup(who, request, work, fake_home):
    if who == "nobody":
        request.getfixturevalue("nobody_python")
        fake_home, work = request.getfixturevalue("nobody_setup")
        return work, fake_home, support.run_as_nobody
    return work, fake_home, subprocess.run


def _root_only_file():
    """A mode-0600 root-owned file in a directory the run is granted (--allow-read)."""
    base = tempfile.mkdtemp(prefix="pipguard-ns-ro-")
    os.chmod(base, 0o755)
    path = os.path.join(base, "root-only")
    with open(path, "w") as fh:
        fh.write("root-only-" + str(os.getpid()))
    os.chmod(path, 0o600)
    return base, path


@requires("root")
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_the_world_inside(who, request, work, fake_home):
    work, home, runner = _setup(who, request, work, fake_home)
    script = work / "world.py"
    script.write_text(WORLD)
    os.chmod(script, 0o644)
    outside = subprocess.Popen(["sleep", "60"])
    base, secret = _root_only_file()
    try:
        r = pg.cli(["run", "--isolation", "ns", "--allow-read", base, "--", sys.executable, str(script),
                  str(outside.pid), str(home.path), secret], cwd=work, env=home.env(), runner=runner)
    finally:
        outside.kill()
        outside.wait()
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert facts["outside_visible"] is False and max(facts["pids"]) < 100, facts
    assert 1 in facts["pids"]  # pipguard's init
    assert facts["links"] == ["lo"]
    assert facts["uid"] == support.NOBODY  # as root too: never uid 0 on the host
    assert facts["hostname"] == "pipguard"
    assert facts["secret"] == errno.EACCES and facts["secret_owner"] == support.NOBODY
    assert facts["home_is_tmpfs"] and ".ssh" in facts["home"] and ".bashrc" not in facts["home"]
    assert facts["tmp_is_tmpfs"]
    assert "ns" in r.report["isolation"]["applied"]
    assert r.report["policy"]["observe_reads"] is None  # default: off under ns
    os.unlink(secret)
    os.rmdir(base)


@requires("root")
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_build_dir_is_written_as_its_owner(who, request, work, fake_home):
    work, home, runner = _setup(who, request, work, fake_home)
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c", "echo built > out.txt; echo t > /tmp/t; cat /tmp/t"],
             cwd=work, env=home.env(), runner=runner)
    assert r.returncode == 0, r.stderr
    assert (work / "out.txt").read_text() == "built\n"
    assert (work / "out.txt").stat().st_uid == work.stat().st_uid  # on disk: the owner's, not 65534 as root
    assert r.report["verdict"] == "clean", r.report["events"]


@requires("root")
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_setsid_daemon_dies_with_the_namespace(who, request, work, fake_home):
    work, home, runner = _setup(who, request, work, fake_home)
    marker = f"pipguard-ns-daemon-{os.getpid()}-{who}"
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c",
              f"(setsid sh -c 'sleep 300; : {marker}' </dev/null >/dev/null 2>&1 &); sleep 0.3; exit 3"],
             cwd=work, env=home.env(), runner=runner)
    assert r.returncode == 3, r.stderr
    for _ in range(50):
        if not [a for a in pg.live_argvs() if any(marker in x for x in a)]:
            break
        time.sleep(0.1)
    assert not [a for a in pg.live_argvs() if any(marker in x for x in a)]
    lingering = r.blocked(kind="process", rule="lingering-process")
    assert lingering and any(marker in e["target"] for e in lingering), r.report["events"]


@requires("root")
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_native_decoy_read_is_reported_without_read_observation(who, request, work, fake_home, try_one_bin):
    """The quiet attacker reads a key natively: it gets a decoy (never the
    fake home's marker), and the read is a finding though no open is notified."""
    work, home, runner = _setup(who, request, work, fake_home)
    key = home.secrets["id_rsa"]
    r = pg.cli(["run", "--isolation", "ns", "--allow-read", os.path.dirname(str(try_one_bin)), "--", "sh", "-c",
              f"{try_one_bin} read {key}; cat {key}"],
             cwd=work, env=home.env(), runner=runner)
    out = parse_try_one(r.stdout)
    assert out["ok"] is True, out  # it read *something*: the decoy
    assert "pipguard-decoy-" in r.stdout and home.markers["id_rsa"] not in r.stdout
    found = r.blocked(kind="file-read", rule="decoy-read")
    assert [e["target"] for e in found] == [str(key)], r.report["events"]
    assert found[0]["layer"] == "ns" and r.report["verdict"] == "blocked"
    assert r.report["supervision"].get("answered_natively", 0) < 50  # opens are not notified


def test_every_credential_location_of_the_rule_table_is_a_decoy():
    """The one rule table decides what a credential is; the real homes' decoys follow it:
    each location has a decoy file at it or below it (a directory's first file)."""
    from pipguard import rules
    from pipguard.sandbox.backends.ns import decoys

    for rel in rules.CREDENTIAL_PATHS:
        assert any(d == rel or d.startswith(rel + "/") for d in decoys.DECOYS), rel
    assert set(decoys.DECOY_DIRECTORIES) <= set(rules.CREDENTIAL_PATHS)
    for rel in decoys.HOME_DECOYS:  # the run's own $HOME: nothing a build tool looks up by itself
        assert not any(rel == c or rel.startswith(c + "/") for c in rules.CONFIG_LOOKUPS), rel


def test_native_reads_of_credential_decoys_are_reported_under_auto(work, fake_home):
    """The loud native stealer under the default isolation (ns here, read observation off):
    a file (~/.netrc), a directory's key (~/.gnupg/...), a listing (~/.mozilla) and a history
    file, at the real home's path: each a decoy-read finding, no real marker anywhere."""
    home = fake_home.path
    targets = [f"{home}/.netrc", f"{home}/.gnupg/private-keys-v1.d/pipguard.key", f"{home}/.bash_history"]
    r = pg.cli(["run", "--", "sh", "-c", f"cat {' '.join(targets)}; ls -a {home}/.mozilla"],
               cwd=work, env=fake_home.env())
    assert "ns" in r.report["isolation"]["applied"], r.report["isolation"]
    assert not fake_home.leaked(r.stdout.encode()), r.stdout
    read = {e["target"] for e in r.blocked(kind="file-read", rule="decoy-read")}
    assert read >= {*targets, f"{home}/.mozilla"}, r.report["events"]
    assert r.report["verdict"] == "blocked"


#: a browser and wallet stealer's usual targets, relative to a home (the Firefox ones found
#: through profiles.ini, as stealers do: the profile directory's name is random)
STORES = {"chrome-cookies": ".config/google-chrome/Default/Cookies",
          "chrome-local-state": ".config/google-chrome/Local State",
          "exodus": ".config/Exodus/exodus.wallet/seed.seco",
          "electrum": ".electrum/wallets/default_wallet",
          # attacked (issue 33/29): each read ENOENT under ns, unreported
          "edge-login": ".config/microsoft-edge/Default/Login Data",
          "discord-token": ".config/discord/Local Storage/leveldb/000005.ldb",
          "telegram": ".local/share/TelegramDesktop/tdata/key_datas",
          "thunderbird": ".thunderbird/pipguard.default-release/logins.json",
          "solana": ".config/solana/id.json"}
STORE_THIEF = textwrap.dedent("""
    import configparser, os, sys
    home, quiet, names = sys.argv[1], sys.argv[2] == "quiet", sys.argv[3:]
    ini = configparser.ConfigParser()
    ini.read_string(os.popen(f"cat '{home}/.mozilla/firefox/profiles.ini'").read())
    profile = os.path.join(home, ".mozilla/firefox", ini["Profile0"]["Path"])
    paths = [os.path.join(home, n) for n in names] + [os.path.join(profile, n)
                                                       for n in ("logins.json", "key4.db")]
    for path in paths:
        if quiet:  # a native cat: no audit hook sees it, read observation is off under ns
            print(path + "\\t" + os.popen(f"cat '{path}' 2>&1").read().strip().replace("\\n", " "))
            continue
        try:
            print(path + "\\t" + open(path).read().strip().replace("\\n", " "))
        except OSError as exc:
            print(path + "\\trefused", exc.errno)
""")


@requires("root")
@pytest.mark.parametrize("how", ["quiet", "loud"])
@pytest.mark.parametrize("where", ["real-home", "own-home"])
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_browser_and_wallet_stores_are_decoys_under_ns(who, how, where, request, work, fake_home):
    """A stealer of browser and wallet stores under ns (read observation off), at the real
    home's path and at its own ``$HOME``: Chrome's Cookies and Local State, Firefox's
    logins.json and key4.db (through profiles.ini), an Exodus seed, an Electrum wallet. The
    fake home has a canary at each; the stealer gets a decoy or a refusal, never a canary,
    and every file is reported: a native ``cat`` by the decoy (``decoy-read``), a Python
    ``open`` by the audit hook first (``secret-read``: refused before it opens anything)."""
    work, fake_home, runner = _setup(who, request, work, fake_home)
    canaries = {}
    for key, rel in STORES.items():
        path = fake_home.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        canaries[key] = f"PIPGUARD-FAKE-SECRET-{key}"
        path.write_text(canaries[key] + "\n")
        if who == "nobody":
            shutil.chown(path.parent, "nobody")
            shutil.chown(path, "nobody")
    (work / "thief.py").write_text(STORE_THIEF)
    home = str(fake_home.path) if where == "real-home" else "$HOME"
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c",
                f'exec {sys.executable} thief.py "{home}" {how} ' + " ".join(
                    shlex.quote(rel) for rel in STORES.values())],
               cwd=work, env=fake_home.env(), runner=runner)
    assert r.returncode == 0, r.stderr
    assert "ns" in r.report["isolation"]["applied"], r.report["isolation"]
    assert not fake_home.leaked(r.stdout.encode()) and not [
        c for c in canaries.values() if c in r.stdout + r.stderr], r.stdout
    lines = dict(line.split("\t", 1) for line in r.stdout.splitlines())
    assert len(lines) == len(STORES) + 2, r.stdout
    firefox = [p for p in lines if "/.mozilla/firefox/" in p]
    assert all("/pipguard.default-release/" in p for p in firefox), firefox
    expected = "decoy-read" if how == "quiet" else "secret-read"
    reported = {e["target"] for e in r.blocked(kind="file-read", rule=expected)}
    for path, got in lines.items():
        if how == "quiet":
            assert "pipguard-decoy-" in got or path.endswith("key4.db"), (path, got)
        else:
            assert got == f"refused {errno.EACCES}", (path, got)
        assert path in reported, (path, r.report["events"])
    assert r.report["verdict"] == "blocked"


def test_a_split_directory_is_bound_whole_with_what_it_left_out_masked(tmp_path):
    """/etc, granted entry by entry around its secrets, was ~150 bind mounts per run: a
    directory split that finely is bound whole, and every entry left out is masked (an empty
    file, an empty directory); grants below a masked directory are bound on top of it."""
    from pathlib import Path

    from pipguard.sandbox.backends.ns import spec as nsspec

    # not below /tmp: the namespace's own /tmp is never collapsed (Landlock grants it whole)
    base = Path(tempfile.mkdtemp(dir="/var/tmp"))
    request_cleanup = shutil.rmtree
    d = base / "etc"
    d.mkdir()
    for i in range(nsspec.COLLAPSE_AT + 3):
        (d / f"conf{i}").write_text("ok")
    (d / "shadow").write_text("SECRET")
    (d / "ssl").mkdir()
    (d / "ssl" / "private").mkdir()
    (d / "ssl" / "certs").mkdir()
    (d / "link").symlink_to("conf0")  # granted by name: a symlink granted is no obstacle
    grants = [str(d / f"conf{i}") for i in range(nsspec.COLLAPSE_AT + 3)] + [str(d / "ssl" / "certs"), str(d / "link")]
    spec = nsspec.spec_for(grants, [], [], [], False)
    kinds = {m.path: m.kind for m in spec.mounts}
    assert kinds[str(d)] == "ro" and kinds[str(d / "shadow")] == "mask" and kinds[str(d / "ssl")] == "mask"
    assert kinds[str(d / "ssl" / "certs")] == "ro"
    assert not [p for p in kinds if p.startswith(str(d / "conf"))]  # no bind per entry
    # a home inside it (its decoy tmpfs goes below): split
    kinds = {m.path: m.kind for m in nsspec.spec_for(grants, [], [], [str(d / "home")], False).mounts}
    assert str(d) not in kinds and kinds[str(d / "conf0")] == "ro"
    # a left-out symlink cannot be covered by a mount: the directory stays split then
    (d / "other").symlink_to("shadow")
    kinds = {m.path: m.kind for m in nsspec.spec_for(grants, [], [], [], False).mounts}
    assert str(d) not in kinds and kinds[str(d / "conf0")] == "ro"
    request_cleanup(base)
    # below /tmp: never collapsed
    t = tmp_path / "etc"
    t.mkdir()
    for i in range(nsspec.COLLAPSE_AT + 3):
        (t / f"conf{i}").write_text("ok")
    (t / "shadow").write_text("SECRET")
    kinds = {m.path: m.kind for m in nsspec.spec_for([str(t / f"conf{i}") for i in range(nsspec.COLLAPSE_AT + 3)],
                                                     [], [], [], False).mounts}
    assert str(t) not in kinds and "mask" not in kinds.values()


def test_etcs_secrets_are_not_in_the_namespace(work, fake_home):
    """The real /etc under ns: its secrets (rules.ETC_SECRETS that exist here) show no byte of
    what they hold, readable or not; what the plan grants reads as on the host."""
    from pipguard import rules

    secrets = [p for p in rules.ETC_SECRETS if os.path.isfile(p) and os.path.getsize(p)]
    if not secrets:
        pytest.skip("no non-empty /etc secret on this host")
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c",
                "for f in \"$@\"; do printf '%s ' \"$(cat \"$f\" 2>/dev/null | wc -c)\"; done; "
                "wc -c < /etc/passwd", "sh", *secrets], cwd=work, env=fake_home.env())
    sizes = r.stdout.split()
    assert sizes[:-1] == ["0"] * len(secrets), (secrets, r.stdout)
    assert int(sizes[-1]) == os.path.getsize("/etc/passwd")
    assert r.returncode == 0, r.stderr


@requires("root")
def test_no_setuid_root_file_is_left_on_the_host(work, fake_home):
    """As root under ns the build dir is idmapped: a file the sandbox writes is root's on the
    host, where the mount's nosuid does not hold. A build that copies a program and makes it
    setuid (chmod: refused in the kernel and reported) or creates one with a setuid mode
    (open(O_CREAT, 0o6755): refused by the supervisor before the file exists, and reported —
    the native responder forwards such opens) leaves no setuid-root file, not even while the
    run lasts."""
    r = pg.cli(["run", "--", "sh", "-c",
                "cp /usr/bin/id ./suid; chmod 4755 ./suid; chmod 2755 ./suid; "
                f"{sys.executable} -I -c \"import os; os.close(os.open('made', os.O_CREAT | os.O_WRONLY, 0o6755))\"; "
                "ls -l made 2>&1"],
               cwd=work, env=fake_home.env())
    assert "ns" in r.report["isolation"]["applied"], r.report["isolation"]
    assert not (work / "made").exists() and "No such file" in r.stdout, r.stdout
    st = os.lstat(work / "suid")
    assert not st.st_mode & 0o6000, (oct(st.st_mode), st.st_uid)
    denied = r.blocked(kind="syscall", rule="syscall-denied")
    assert any(e["target"] in ("chmod", "fchmodat", "fchmodat2") for e in denied), r.report["events"]
    (refused,) = r.blocked(kind="file-write", rule="privileged-mode")
    assert refused["target"] == str(work / "made") and refused["layer"] == "supervisor", refused
    assert refused["detail"]["mode"] == "6755", refused
    assert r.report["verdict"] == "blocked"


def test_probe_says_ns_works_here():
    from pipguard.sandbox.backends import ns

    probe = ns.probe(refresh=True)
    assert probe.available, probe.to_json()
    assert {p.name for p in probe.parts} >= {"user", "uid_map", "mount", "pid", "net", "idmap"}


DENY_USERNS = textwrap.dedent("""
    import errno, os, sys
    import pyseccomp as sc
    f = sc.SyscallFilter(sc.ALLOW)
    f.add_rule(sc.ERRNO(errno.EPERM), "unshare")
    f.load()
    os.execv(sys.executable, [sys.executable, "-m", "pipguard", *sys.argv[1:]])
""")


def test_fallback_when_user_namespaces_are_denied(work, fake_home):
    """A seccomp filter around pipguard (as a container runtime's default
    profile does) refuses unshare: --isolation ns fails with exit 2 and says
    why, doctor lists the ns parts as missing, the default isolation still runs."""
    wrapper = work / "deny_userns.py"
    wrapper.write_text(DENY_USERNS)
    env = fake_home.env()

    def pg(*args):
        return subprocess.run([sys.executable, str(wrapper), *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=120)

    r = pg("run", "--isolation", "ns", "--", "true")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "namespace backend is unavailable" in r.stderr and "seccomp" in r.stderr, r.stderr
    doctor = pg("doctor", "--format", "json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["ns.user"]["status"] == "missing" and "seccomp" in checks["ns.user"]["detail"]
    # auto falls back to the plain backend and says why, in the report
    report = work / "auto.json"
    r = pg("run", "--report", str(report), "--", "true")
    assert r.returncode == 0, (r.stdout, r.stderr)
    data = json.loads(report.read_text())
    assert "ns" not in data["isolation"]["applied"], data["isolation"]
    ns_state = data["isolation"]["protections"]["ns"]
    assert ns_state["state"] == "unavailable" and "seccomp" in ns_state["reason"], ns_state


def test_auto_chooses_ns_where_it_works(work, fake_home):
    """Where the namespace backend works, the default isolation runs in it: its own pid
    namespace, only lo, decoys at the home's path, read observation off (the decoys report)."""
    report = work / "auto.json"
    r = subprocess.run([sys.executable, "-m", "pipguard", "run", "--report", str(report), "--", "sh", "-c",
                        "grep -c : /proc/net/dev; grep -o lo: /proc/net/dev; ls /proc | grep -c '^[0-9]'; "
                        "head -c 64 \"$1\"/.ssh/id_rsa",
                        "sh", str(fake_home.path)], cwd=work, env=fake_home.env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    data = json.loads(report.read_text())
    assert data["isolation"]["requested"] == "auto" and "ns" in data["isolation"]["applied"]
    assert data["isolation"]["protections"]["ns"]["state"] == "active"
    lines = r.stdout.splitlines()
    assert lines[:2] == ["1", "lo:"], r.stdout  # one interface, lo: its own net namespace
    assert int(lines[2]) < 8, r.stdout  # its own pid namespace: pid 1, sh and its commands
    assert "pipguard-decoy" in r.stdout and not fake_home.leaked(r.stdout.encode()), r.stdout
    assert any(e["rule"] == "decoy-read" for e in data["events"]), data["events"]
    assert data["supervision"].get("answered_natively", 0) < 20, data["supervision"]  # opens not observed


# ------------------------------------------------------------ issue 14, install under ns
HOSTS = ATTEMPT + textwrap.dedent("""
    import socket, sys, urllib.request
    allowed, other = int(sys.argv[1]), int(sys.argv[2])
    attempt("allowed-via-proxy", lambda: print(urllib.request.urlopen(
        f"http://127.0.0.1:{allowed}/", timeout=10).read().decode()))
    attempt("allowed-direct", lambda: socket.create_connection(("127.0.0.1", allowed), timeout=5))
    attempt("other-via-proxy", lambda: urllib.request.urlopen(f"http://127.0.0.1:{other}/LEAK", timeout=10).read())
    attempt("other-direct", lambda: socket.create_connection(("127.0.0.1", other), timeout=5).sendall(b"LEAK"))
""")


@requires("root")
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_allowed_host_through_the_proxy_only(who, request, work, fake_home, loopback_tcp):
    """Only ``lo`` inside: the allowed host is reached through pipguard's filtering proxy (the
    supervisor connects the sandbox's socket to it from pipguard's own network namespace),
    never directly; another host is refused by the proxy and reported; a direct connect to
    the host's loopback reaches nothing."""
    import http.server
    import threading

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"hello-from-the-build-host"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    work, home, runner = _setup(who, request, work, fake_home)
    script = work / "hosts.py"
    script.write_text(HOSTS)
    os.chmod(script, 0o644)
    try:
        r = pg.cli(["run", "--isolation", "ns", "--allow-host", f"127.0.0.1:{port}", "--", sys.executable,
                  str(script), str(port), str(loopback_tcp.port)], cwd=work, env=home.env(), runner=runner)
    finally:
        server.shutdown()
        server.server_close()
    assert "allowed-via-proxy ok" in r.stdout and "hello-from-the-build-host" in r.stdout, r.stdout + r.stderr
    assert "allowed-direct failed" in r.stdout
    assert "other-via-proxy failed" in r.stdout and "other-direct failed" in r.stdout
    assert loopback_tcp.received == []
    assert any(n["port"] == port and n["action"] == "allowed" and n["layer"] == "proxy"
               for n in r.report["network"]), r.report["network"]
    blocked = r.targets(kind="network")
    assert f"127.0.0.1:{loopback_tcp.port}" in blocked and f"127.0.0.1:{port}" in blocked  # direct ones


@requires("root")
def test_pid1_shows_nothing_of_pipguard(work, fake_home):
    """The namespace's pid 1 is a fork of pipguard: its command line (readable by any process)
    and environment would be pipguard's, an index URL with credentials among them."""
    marker = f"pipguard-ns-argv-marker-{os.getpid()}"
    env = fake_home.env({"PIP_INDEX_URL": f"http://u:{marker}@127.0.0.1:9/simple/"})
    report = work / f"{marker}.json"
    proc = subprocess.run([sys.executable, "-m", "pipguard", "run", "--isolation", "ns", "--report", str(report),
                           "--", "sh", "-c", "cat /proc/1/cmdline; echo; cat /proc/1/environ; echo; "
                           "tr '\\0' ' ' </proc/self/cmdline"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert "tr" in proc.stdout, proc.stderr  # the command ran and read /proc
    assert marker not in proc.stdout, proc.stdout


def _ns_pids(ancestor):
    """{namespace pid: host pid} of the processes below ``ancestor`` that live in a pid namespace."""
    def status(pid):
        with open(f"/proc/{pid}/status") as fh:
            return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)

    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            st = status(name)
            chain, pid = [], int(st["PPid"])
            while pid > 1 and pid != ancestor and len(chain) < 20:
                chain.append(pid)
                pid = int(status(pid)["PPid"])
        except (OSError, KeyError, ValueError):
            continue
        nspid = st.get("NSpid", "").split()
        if pid == ancestor and len(nspid) == 2:
            found[int(nspid[1])] = int(name)
    return found


def _status_field(pid: int, name: str) -> str:
    for line in open(f"/proc/{pid}/status"):
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise KeyError(name)


@requires("strace")
def test_pid1_is_not_dumpable_before_the_command_execs(work, fake_home, tmp_path):
    """The order, not a moment caught under load: pid 1 turns not dumpable (after the launcher
    took its fds) before the command's execve starts — never in the window after it. strace
    records both processes' calls in the order the kernel ran them."""
    record = tmp_path / "strace.out"
    proc = subprocess.run(["strace", "-f", "-qq", "-e", "trace=prctl,execve", "-o", str(record),
                           sys.executable, "-m", "pipguard", "run", "--isolation", "ns", "--", "/bin/true"],
                          cwd=work, env=fake_home.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = record.read_text().splitlines()
    sealed = [i for i, line in enumerate(lines) if "PR_SET_DUMPABLE, SUID_DUMP_DISABLE" in line]
    command = [i for i, line in enumerate(lines) if 'execve("/bin/true"' in line]
    assert sealed and command, "\n".join(lines[-30:])
    assert max(sealed) < command[0], "\n".join(lines[min(sealed + command):])


@requires("root")
def test_pid1_is_not_dumpable_once_the_command_runs(work, fake_home):
    """pid 1 holds pipguard's memory (index credentials included). Landlock's ptrace scope keeps
    the sandbox out of /proc/1/mem; where Landlock is missing, what remains is that pid 1 is not
    dumpable once the launcher took the decoy watch: its /proc files are then the host root's,
    not the sandbox uid's (seen from outside, as root: while the command runs)."""
    proc = subprocess.Popen([sys.executable, "-m", "pipguard", "run", "--isolation", "ns", "--", "sleep", "30"],
                            cwd=work, env=fake_home.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        pids = {}
        while time.monotonic() < deadline:
            pids = _ns_pids(proc.pid)
            if 1 in pids and 2 in pids and open(f"/proc/{pids[2]}/comm").read().strip() == "sleep":
                break
            time.sleep(0.001 if 1 in pids else 0.05)  # from pid 1 on: the first moment the command runs
        assert 1 in pids and 2 in pids, pids
        command_owner = os.stat(f"/proc/{pids[2]}/environ").st_uid
        assert command_owner == support.NOBODY  # the sandbox's uid, dumpable: its own files
        assert os.stat(f"/proc/{pids[1]}/environ").st_uid == 0  # pid 1: not dumpable
        assert os.stat(f"/proc/{pids[1]}/mem").st_uid == 0
        # the namespace's creator (pid 1's parent, outside the namespace) is a fork of pipguard too
        creator = int(_status_field(pids[1], "PPid"))
        assert os.stat(f"/proc/{creator}/environ").st_uid == 0, creator
        # pid 1 catches no standard signal: from inside, a namespace's pid 1 gets only the signals
        # it has a handler for, and pipguard's SIGINT/SIGTERM handlers came with the fork (review).
        # Above 31: glibc's own (SIGCANCEL, SIGSETXID), which ignore what they did not ask for.
        caught = int(_status_field(pids[1], "SigCgt"), 16)
        assert caught & 0x7FFFFFFF == 0, [n for n in range(1, 32) if caught >> (n - 1) & 1]
    finally:
        proc.kill()
        proc.wait()


@requires("root")
def test_a_tree_only_its_owner_may_enter_is_readable_read_only(work, fake_home):
    """pip's build environment is a 0700 directory of root's: as root the sandbox is uid
    65534, so ns shows a granted tree closed to others with its owner mapped to the sandbox's
    uid, read-only (the plain backend grants the same by ACL). A root-only file in a tree open
    to others stays unreadable (test_the_world_inside)."""
    base = tempfile.mkdtemp(prefix="pipguard-ns-owner-")  # 0700, root's
    try:
        with open(os.path.join(base, "module.py"), "w") as fh:
            fh.write("VALUE = 'owner-only-tree'\n")
        r = pg.cli(["run", "--isolation", "ns", "--allow-read", base, "--", "sh", "-c",
                  f"cat {base}/module.py; touch {base}/new && echo wrote || echo refused"],
                 cwd=work, env=fake_home.env())
        assert "owner-only-tree" in r.stdout, r.stdout + r.stderr
        assert "refused" in r.stdout and not os.path.exists(os.path.join(base, "new"))
        assert os.stat(base).st_uid == 0 and oct(os.stat(base).st_mode & 0o777) == "0o700"  # unchanged
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_observe_reads_on_under_ns(work, fake_home):
    """``--observe-reads`` turns read observation on under ns (off by default there): the native
    key read is then refused by the supervisor (secret-read) before any decoy is opened; both
    flags together are a usage error."""
    key = str(fake_home.secrets["id_rsa"])
    r = pg.cli(["run", "--isolation", "ns", "--observe-reads", "--", "cat", key], cwd=work, env=fake_home.env())
    assert r.returncode == 1 and "pipguard-decoy-" not in r.stdout, (r.stdout, r.stderr)
    assert r.report["policy"]["observe_reads"] is True
    (event,) = [e for e in r.blocked(kind="file-read") if e["target"] == key]
    assert event["rule"] == "secret-read" and event["layer"] == "supervisor", r.report["events"]
    both = pg.cli(["run", "--isolation", "ns", "--observe-reads", "--no-observe-reads", "--", "true"],
                cwd=work, env=fake_home.env())
    assert both.returncode == 2 and "contradict" in both.stderr, both.stderr


def test_siblings_proc_files_are_its_own_under_ns_with_read_observation(work, fake_home):
    """In its own pid namespace every /proc/<n> is one of the sandbox's processes: ``ps``-like
    reads of a sibling's cmdline and environ with read observation on are no finding (they
    were ``proc-other-process``: the namespace pid was looked up as a host pid), while the
    key read in the same run still is."""
    key = str(fake_home.secrets["id_rsa"])
    # the sibling is read once it runs sleep (before its exec it is a copy of the shell)
    script = ('sleep 5 & kid=$!; i=0; until [ "$(tr "\\0" " " < /proc/$kid/cmdline)" = "sleep 5 " ] '
              '|| [ $i -ge 1000 ]; do i=$((i+1)); done; tr "\\0" " " < /proc/$kid/cmdline; echo; '
              'wc -c < /proc/$kid/environ; cat /proc/1/cmdline | wc -c; kill $kid; cat "$1"')
    r = pg.cli(["run", "--isolation", "ns", "--observe-reads", "--", "sh", "-c", script, "sh", key],
               cwd=work, env=fake_home.env())
    assert r.stdout.splitlines()[0].strip() == "sleep 5", (r.stdout, r.stderr)
    assert int(r.stdout.splitlines()[1]) > 0  # a sibling's environ: readable, its own
    assert not [e for e in r.report["events"] if e["rule"] == "proc-other-process"], r.report["events"]
    assert [e["rule"] for e in r.blocked(kind="file-read") if e["target"] == key] == ["secret-read"]


LANDLOCK_ONLY = textwrap.dedent("""
    import json, sys
    from pipguard.sandbox.policy import Policy
    from pipguard.sandbox import run
    isolation, settings = sys.argv[1], sys.argv[2:]
    script = "; ".join(f'[ -w {d} ] && echo looks-writable; echo x > {d}/planted || echo refused' for d in settings)
    report = run(["sh", "-c", script], Policy(isolation=isolation, read_only_by_landlock=tuple(settings)))
    print(json.dumps(report.to_json()))
""")


@pytest.mark.parametrize("backend", pg.BACKEND_PARAMS, indirect=True)
def test_a_landlock_only_read_grant_looks_writable_and_refuses_writes(backend, work, fake_home):
    """makepkg's ``[[ -w $SRCDEST ]]``: a ``read_only_by_landlock`` directory answers
    ``access(W_OK)`` from its mode (a read-only mount would answer EROFS), and the write itself is
    refused by Landlock, reported, and leaves nothing on the host — on both backends. Below /tmp
    the namespace's own tmpfs is granted whole to Landlock (its rule covers what is mounted
    below), so there ns keeps the read-only mount: the write fails all the same."""
    outside = tempfile.mkdtemp(prefix="pipguard-ns-settings-", dir="/var/tmp")
    below_tmp = tempfile.mkdtemp(prefix="pipguard-ns-settings-", dir="/tmp")
    for d in (outside, below_tmp):
        os.chmod(d, 0o777)  # its mode says: writable by anyone (the sandbox's uid included)
    try:
        proc = subprocess.run([sys.executable, "-c", LANDLOCK_ONLY, backend.isolation, outside, below_tmp],
                              cwd=work, env=fake_home.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert ("ns" in report["isolation"]["applied"]) == backend.ns
        said = proc.stdout.split()
        assert said.count("refused") == 2, proc.stdout
        assert said.count("looks-writable") == (1 if backend.ns else 2), proc.stdout
        assert os.listdir(outside) == [] and os.listdir(below_tmp) == []
        blocked = {e["target"] for e in report["events"] if e["action"] == "blocked" and e["kind"] == "file-write"}
        assert os.path.join(outside, "planted") in blocked, report["events"]
    finally:
        shutil.rmtree(outside, ignore_errors=True)
        shutil.rmtree(below_tmp, ignore_errors=True)


# --------------------------------------- issue 14: what ns keeps from the host's eyes and ours
@requires("root")
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_native_writes_in_the_namespace_tmp_are_files_written(who, request, work, fake_home):
    """A native write below the namespace's own /tmp or /dev/shm lands in a
    private tmpfs (gone with it): it is reported as a file written, discarded,
    with its content's hash; pipguard's own mount points there are not. The
    build dir (bound inside, below /tmp here when the test's work dir is) and
    the sandbox's HOME are snapshotted as before, never listed as discarded."""
    import hashlib

    work, home, runner = _setup(who, request, work, fake_home)
    staged = f"stolen-looking-{os.getpid()}-{who}\n"
    script = ("printf %s \"$1\" > /tmp/stage.txt; mkdir -p /tmp/d/e; printf y > /tmp/d/e/y; "
              "printf s > /dev/shm/sem.x; ln -s /etc/hostname /tmp/link; mkfifo /tmp/fifo; "
              "echo built > out.txt; (sleep 30; printf late > /tmp/late) & exit 0")
    r = pg.cli(["run", "--isolation", "ns", "--record-build-dir", "--", "sh", "-c", script, "sh", staged],
               cwd=work, env=home.env(), runner=runner)
    assert r.returncode == 0, r.stderr
    written = {f["path"]: f for f in r.report["files_written"]}
    discarded = {p: f for p, f in written.items() if f.get("discarded")}
    # exactly what the run wrote there: no mount point, no symlink, no fifo, nothing late
    assert sorted(discarded) == ["/dev/shm/sem.x", "/tmp/d/e/y", "/tmp/stage.txt"], written
    assert discarded["/tmp/stage.txt"]["sha256"] == hashlib.sha256(staged.encode()).hexdigest()
    assert discarded["/tmp/stage.txt"]["size"] == len(staged)
    out = str(work / "out.txt")
    assert out in written and not written[out].get("discarded"), written
    assert not os.path.exists("/tmp/stage.txt") or open("/tmp/stage.txt").read() != staged
    assert r.report["verdict"] != "blocked" or all(e["rule"] == "lingering-process"
                                                   for e in r.report["events"] if e["action"] == "blocked")
    # the table on stderr says the file was not kept (a column of its own)
    from pipguard.report.render import DISCARDED

    assert [line for line in r.stderr.splitlines() if "/tmp/stage.txt" in line and DISCARDED in line], r.stderr


@requires("root")
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_a_write_aimed_at_a_host_directory_below_tmp_is_reported(who, request, work, fake_home, tmp_path):
    """The namespace's /tmp is its own: a host directory below the host's /tmp (a sibling
    project's tree, pip's other builds) is not in it, so a native write there fails with
    ENOENT — and was reported by nothing (the supervisor resolved the path on the host, where
    it is under /tmp, a write root). Now resolved in the sandbox's view: the attempt is a
    finding, the kernel's answer unchanged. A link the sandbox makes in its /tmp is followed
    in its world (to /etc: refused and reported). Its own /tmp stays writable, unreported."""
    work, home, runner = _setup(who, request, work, fake_home)
    victim = pathlib.Path(tempfile.mkdtemp(prefix="pipguard-ns-victim-", dir="/tmp"))
    try:
        os.chmod(victim, 0o777)
        script = (f'echo x >> "{victim}/native.py" 2>/dev/null; echo "host=$?"; '
                  'ln -s /etc /tmp/l; echo x > /tmp/l/pipguard-probe 2>/dev/null; echo "link=$?"; '
                  'mkdir /tmp/own && echo x > /tmp/own/f; echo "own=$?"; '
                  'echo x > /tmp/missing/f 2>/dev/null; echo "missing=$?"; '
                  # review: a removed cwd's name ends in " (deleted)": `..` from it is still real
                  # second review: a directory *named* "... (deleted)", and /proc/self's root, cwd, fd
                  'mkdir -p "/tmp/a (deleted)" && ln -s /etc "/tmp/a (deleted)/l"; '
                  'echo x > "/tmp/a (deleted)/l/pipguard-probe-named" 2>/dev/null; '
                  'echo x > /proc/self/root/tmp/l/pipguard-probe-root 2>/dev/null; '
                  '(cd /tmp && echo x > /proc/self/cwd/l/pipguard-probe-cwd 2>/dev/null); '
                  '(exec 7</tmp; echo x > /proc/self/fd/7/l/pipguard-probe-fd 2>/dev/null); '
                  # third review: its /proc by other names, and a link to its own root
                  'echo x > /proc/thread-self/root/tmp/l/pipguard-probe-thread 2>/dev/null; '
                  'echo x > /proc/$$/root/tmp/l/pipguard-probe-nspid 2>/dev/null; '
                  'echo x > /proc//self/./root/tmp/l/pipguard-probe-slashes 2>/dev/null; '
                  'echo x > /tmp/../proc/self/root/tmp/l/pipguard-probe-dotdot 2>/dev/null; '
                  'ln -s /proc/self/root /tmp/r; echo x > /tmp/r/tmp/l/pipguard-probe-rootlink 2>/dev/null; '
                  'mkdir gone && cd gone && rmdir ../gone; '
                  'echo x >> ' + "../" * 40 + 'etc/pipguard-probe-deleted 2>/dev/null; echo "deleted=$?"')
        r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c", script], cwd=work, env=home.env(),
                   runner=runner)
        assert "host=2" in r.stdout and "link=2" in r.stdout and "own=0" in r.stdout, (r.stdout, r.stderr)
        assert "missing=2" in r.stdout, r.stdout
        assert not (victim / "native.py").exists()
        blocked = {e["target"]: e for e in r.report["events"]
                   if e["kind"] == "file-write" and e["action"] == "blocked"}
        assert str(victim / "native.py") in blocked, r.report["events"]
        assert blocked[str(victim / "native.py")]["rule"] == "write-outside-roots"
        assert "/etc/pipguard-probe" in blocked, r.report["events"]
        assert "deleted=2" in r.stdout and "/etc/pipguard-probe-deleted" in blocked, r.report["events"]
        for how in ("named", "root", "cwd", "fd"):
            assert f"/etc/pipguard-probe-{how}" in blocked, (how, r.report["events"])
        for how in ("thread", "nspid", "slashes", "dotdot", "rootlink"):  # resolved, or refused as unknown
            assert [t for t in blocked if t.endswith(f"/pipguard-probe-{how}")], (how, r.report["events"])
        # its own /tmp, and a directory that exists nowhere: nothing to report
        assert not [t for t in blocked if t.startswith(("/tmp/own", "/tmp/missing"))], blocked
        assert r.report["verdict"] == "blocked"
    finally:
        shutil.rmtree(victim, ignore_errors=True)


@requires("root")
@pytest.mark.parametrize("isolation", ["ns", "os"])
def test_a_process_that_hides_its_memory_is_refused_and_reported(isolation, request, work, fake_home,
                                                                try_one_bin):
    """Found by review: pipguard as a normal user cannot read the memory of a process that made
    itself non-dumpable (prctl), so the path of its open was unknown — and the open went
    through unreported (Landlock still refused it). Now it is refused and reported."""
    work, home, runner = _setup("nobody", request, work, fake_home)
    target = "/etc/pipguard-hidden"
    r = pg.cli(["run", "--isolation", isolation, "--keep-env", "TRY_ONE_UNDUMPABLE",
                "--allow-read", os.path.dirname(str(try_one_bin)), "--", str(try_one_bin), "write", target],
               cwd=work, env=dict(home.env(), TRY_ONE_UNDUMPABLE="1"), runner=runner)
    out = parse_try_one(r.stdout)
    assert out["ok"] is False, out
    found = r.blocked(kind="file-write", rule="unreadable-arguments")
    assert found and r.report["verdict"] == "blocked", r.report["events"]
    assert not os.path.exists("/etc/pipguard-hidden")


@requires("root")
def test_a_directory_pipguard_may_not_search_counts_as_hidden(request, work, fake_home):
    """Second review: as a normal user pipguard cannot search a directory of the namespace's
    /tmp that the build made mode 000 (the sandbox can, as its owner inside); a write through a
    link in it (to /etc) fell back to the host's view and went unreported."""
    work, home, runner = _setup("nobody", request, work, fake_home)
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c",
                "mkdir /tmp/d && ln -s /etc /tmp/d/l && chmod 000 /tmp/d; "
                "echo x > /tmp/d/l/pipguard-probe 2>/dev/null; chmod 700 /tmp/d"],
               cwd=work, env=home.env(), runner=runner)
    found = r.blocked(kind="file-write", rule="unreadable-arguments")
    assert found and found[0]["target"].startswith("/tmp/d"), r.report["events"]
    assert r.report["verdict"] == "blocked"


@requires("root")
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_no_hidden_open_is_made_up_for_a_process_that_left(who, request, work, fake_home):
    """Second review: a notification whose process exited or exec'd before the supervisor read
    its path, or whose path pointer is unmapped, was reported as a hidden open
    (``unreadable-arguments``) — a false alarm for any multithreaded tool that exits while its
    threads write (cargo, a JVM). Only memory closed to pipguard counts."""
    support.need("gcc")
    work, home, runner = _setup(who, request, work, fake_home)
    race = work / "exit_race"
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(race), str(pathlib.Path(__file__).parent / "helpers"
                                                                    / "exit_race.c")], check=True)
    os.chmod(race, 0o755)
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c",
                f"{race} exit 150; {race} exec 60; {race} badptr 2>/dev/null; true"],
               cwd=work, env=home.env(), runner=runner)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not r.blocked(rule="unreadable-arguments"), r.report["events"][:5]


@requires("root")
@pytest.mark.parametrize("isolation", ["ns", "os"])
def test_a_directory_left_unreadable_to_its_owner_is_listed(isolation, request, work, fake_home):
    """makepkg leaves its pkg/ mode 0111 when a build fails; as a normal user the files
    snapshot could not list it and the run became "blocked" (unlisted-files) instead of
    failed. The run is over: pipguard gives its owner back u+rx and lists it."""
    work, home, runner = _setup("nobody", request, work, fake_home)
    r = pg.cli(["run", "--isolation", isolation, "--record-build-dir", "--", "sh", "-c",
                "mkdir -p pkg/sub && echo x > pkg/sub/f && chmod 111 pkg/sub pkg"],
               cwd=work, env=home.env(), runner=runner)
    assert r.returncode == 0, r.stderr
    assert not [e for e in r.report["events"] if e["rule"] == "unlisted-files"], r.report["events"]
    assert str(work / "pkg" / "sub" / "f") in {f["path"] for f in r.report["files_written"]}
    assert r.report["verdict"] == "clean"


@requires("root")
@pytest.mark.parametrize("isolation", ["ns", "os"])
def test_clone_into_a_user_namespace_is_refused_and_reported(isolation, work, fake_home):
    """Fourth review: unshare(2) was refused, clone(CLONE_NEWUSER) was not — a build got a user
    namespace of its own, and with it chroot, under which the supervisor resolved its paths
    from the wrong root (a write to /etc went unreported under ns)."""
    support.need("gcc")
    probe = work / "userns_clone"
    subprocess.run(["gcc", "-o", str(probe), str(pathlib.Path(__file__).parent / "helpers" / "userns_clone.c")],
                   check=True)
    r = pg.cli(["run", "--isolation", isolation, "--", str(probe)], cwd=work, env=fake_home.env())
    assert json.loads(r.stdout.strip().splitlines()[-1])["clone"] == errno.EPERM, (r.stdout, r.stderr)
    found = r.blocked(kind="syscall")
    assert [e for e in found if e["target"] == "clone"], r.report["events"]


@requires("root")
@pytest.mark.parametrize("who", ["root", "nobody"])
def test_its_own_proc_entries_by_any_name_under_ns(who, request, work, fake_home):
    """Fourth review: a thread's entries (/proc/self/task/TID/root) were resolved on the host
    (a write to /etc through a link in its /tmp went unreported); /proc/NSPID/fd/1 (a pipe) and
    the parent's stdout by its namespace number were refused or crashed the decision; a
    relative write in a removed directory was reported. Writes to its own pipes, by any name,
    are clean; the write through the link is reported."""
    work, home, runner = _setup(who, request, work, fake_home)
    script = ("ln -s /etc /tmp/l; "
              "for t in /proc/self/task/*; do echo x > $t/root/tmp/l/pipguard-probe-task 2>/dev/null; done; "
              "echo own-pid > /proc/$$/fd/1; "
              "exec 3>/tmp/own-file; echo via-dev-fd > /dev/fd/3; cat /tmp/own-file; "
              "sh -c 'echo parent-pid > /proc/$PPID/fd/1'; "
              "mkdir /tmp/x && cd /tmp/x && rmdir /tmp/x && { echo x > g 2>/dev/null; true; }")
    # through a pipe of its own making: a pipe of the test's (root's) is closed to nobody anyway
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c", f"sh -c {shlex.quote(script)} | cat"],
               cwd=work, env=home.env(), runner=runner)
    assert "own-pid" in r.stdout and "parent-pid" in r.stdout, (r.stdout, r.stderr)
    assert "via-dev-fd" in r.stdout, (r.stdout, r.stderr)  # /dev/fd/3: a file of its own /tmp
    blocked = r.blocked(kind="file-write")
    assert [e for e in blocked if e["target"].endswith("pipguard-probe-task")], r.report["events"]
    assert not [e for e in blocked if not e["target"].endswith("pipguard-probe-task")], blocked
    assert not [e for e in r.report["events"] if e["rule"] == "supervisor-error"], r.report["events"]


@requires("root")
@pytest.mark.parametrize("isolation", ["ns", "os"])
def test_a_build_may_reopen_its_stdout_and_stderr(isolation, work, fake_home):
    """Found by review: `tee /dev/stderr`, `echo > /dev/stdout` (dash) or Python's
    open('/dev/stdout') reopen the process's pipe through /proc/self/fd, with the pipe's own
    permissions: 0600 and pipguard's (or pip's) uid, not the sandbox user's — EACCES, where
    plain pip's build writes. pipguard's pipes are now reopenable (nobody else can reach them).
    As root only: as a normal user the sandbox runs as that user (the pipes are its own), and
    a pipe of another user stays closed to it, with or without pipguard."""
    home, runner = fake_home, subprocess.run
    r = pg.cli(["run", "--isolation", isolation, "--", "sh", "-c",
                "echo to-stderr > /dev/stderr && echo to-stdout > /dev/stdout"],
               cwd=work, env=home.env(), runner=runner)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "to-stdout" in r.stdout and "to-stderr" in r.stderr, (r.stdout, r.stderr)
    assert r.report["verdict"] == "clean", r.report["events"]
    # a named FIFO on disk given as stdin is the user's file: its mode is left alone
    fifo = work / "in.fifo"
    os.mkfifo(fifo, 0o600)
    writer = subprocess.Popen(["sh", "-c", f"echo through-the-fifo > {fifo}"])
    with open(fifo) as stdin:
        proc = subprocess.run([sys.executable, "-m", "pipguard", "run", "--isolation", isolation, "--", "cat"],
                              cwd=work, env=home.env(), stdin=stdin, capture_output=True, text=True, timeout=120)
    writer.wait(timeout=30)
    assert "through-the-fifo" in proc.stdout, proc.stderr[-2000:]
    assert stat.S_IMODE(os.stat(fifo).st_mode) == 0o600


@requires("root")
def test_sys_is_the_namespaces_own(work, fake_home):
    """With a net namespace of its own the sandbox gets a sysfs of that namespace:
    /sys/class/net shows only lo, and none of the host's submounts below /sys
    (cgroup, tracefs, debugfs) is there. With the host's network, /sys is the host's."""
    probe = ("ls /sys/class/net; echo --; ls /sys/fs/cgroup | head -3; echo --; "
             "grep -c ' /sys' /proc/self/mountinfo")
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c", probe], cwd=work, env=fake_home.env())
    assert r.returncode == 0, r.stderr
    nets, cgroup, mounts = r.stdout.split("--\n")
    assert nets.split() == ["lo"], r.stdout
    assert cgroup.split() == [], r.stdout
    assert mounts.split() == ["1"], r.stdout  # /sys alone
    host_nets = sorted(os.listdir("/sys/class/net"))
    r = pg.cli(["run", "--isolation", "ns", "--allow-network", "--", "sh", "-c", probe], cwd=work,
               env=fake_home.env())
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split("--\n")[0].split()) == host_nets, r.stdout


# ----------------------- review of the eleventh session: hiding from the /tmp listing
DEEP = "i=0; while [ $i -lt {n} ]; do mkdir d && cd d || exit 9; i=$((i+1)); done; echo x > hidden.txt"


@pytest.mark.parametrize("where", ["namespace-tmp", "write-root"])
def test_a_tree_too_deep_to_walk_is_a_finding_not_a_crash(where, work, fake_home):
    """A run that reads a key and then leaves a tree 1000 directories deep (deeper than
    Python's recursion) in the namespace's /tmp or in a write root (its TMPDIR): pipguard
    ends normally with its report — the key read still in it — and the tree it could not
    list whole in /tmp is a finding (``unlisted-files``)."""
    key = str(fake_home.secrets["id_rsa"])
    base = "/tmp" if where == "namespace-tmp" else "$TMPDIR"
    script = f'cat "$1" > /dev/null; cd {base} && {DEEP.format(n=1000)}'
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c", script, "sh", key], cwd=work, env=fake_home.env())
    assert r.report is not None and "Traceback" not in r.stderr, r.stderr
    assert r.report["verdict"] == "blocked" and r.report["exit_code"] == 0, r.stderr
    assert any(e["rule"] == "decoy-read" for e in r.report["events"]), r.report["events"]
    unlisted = [e for e in r.report["events"] if e["rule"] == "unlisted-files"]
    if where == "namespace-tmp":
        assert unlisted and unlisted[0]["action"] == "blocked", r.report["events"]
        assert "deeper than" in " ".join(unlisted[0]["detail"]["first"])
    else:
        assert not unlisted  # a host write root is snapshotted (iteratively): no /tmp walk there


def test_moving_a_mount_points_parent_does_not_hide_a_file(work, fake_home):
    """The listing leaves out pipguard's own mount points only where they are empty: a run
    that moves the directory holding its TMPDIR's mount away and writes a file at the old
    path still has that file reported."""
    script = ('d=$(dirname "$TMPDIR"); mv "$d" /tmp/moved-away || exit 7; mkdir -p "$TMPDIR"; '
              'echo stash > "$TMPDIR/stash.txt"; echo "$TMPDIR"')
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c", script], cwd=work, env=fake_home.env())
    if r.returncode == 7:
        pytest.skip("the run's TMPDIR is not below the namespace's /tmp here")
    assert r.returncode == 0, r.stderr
    tmpdir = r.stdout.split()[-1]
    discarded = [f["path"] for f in r.report["files_written"] if f.get("discarded")]
    assert tmpdir + "/stash.txt" in discarded, r.report["files_written"]


def test_a_grant_on_tmp_is_not_listed_as_the_runs_files(work, fake_home):
    """``--allow-read /tmp`` binds the host's /tmp over the namespace's: the listing is of
    the namespace's own tmpfs (its handle taken when it was mounted), never of the host's files."""
    # the run's own directories outside /tmp (as root, binds below a read-only host /tmp
    # cannot be made: that launch fails with exit 2), the host's /tmp holding a marker
    outside = tempfile.mkdtemp(prefix="pipguard-grant-tmp-", dir="/var/tmp")
    fd, marker_path = tempfile.mkstemp(prefix="pipguard-host-marker-", dir="/tmp")
    os.write(fd, b"host")
    os.close(fd)
    os.chmod(marker_path, 0o644)
    marker = pathlib.Path(marker_path)
    try:
        run_dir = os.path.join(outside, "work")
        os.mkdir(run_dir)
        env = dict(fake_home.env(), TMPDIR=outside)
        r = pg.cli(["run", "--isolation", "ns", "--allow-read", "/tmp", "--", "ls", str(marker)],
                   cwd=run_dir, env=env)
    finally:
        marker.unlink()
        shutil.rmtree(outside, ignore_errors=True)
    assert r.returncode == 0 and str(marker) in r.stdout, r.stderr  # the host's /tmp is what it sees
    assert not [f for f in r.report["files_written"] if f.get("discarded")], r.report["files_written"]


def test_a_homes_decoy_tmpfs_is_read_only(work, fake_home):
    """At a home's path there are decoys and nothing else: the run cannot stash what it read
    there (a home below /tmp, as this test's, was writable: Landlock grants /tmp whole)."""
    home = str(fake_home.path)
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c", f"echo stolen > {home}/stash.txt"],
               cwd=work, env=fake_home.env())
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(home, "stash.txt"))


@pytest.mark.parametrize("grant", ["home", "home/.ssh"])
def test_a_write_grant_in_a_home_never_gets_decoys_over_real_files(grant, work, fake_home):
    """``--allow-write ~`` or ``~/.ssh`` shows the real directory inside: no decoy is planted
    through it (planting there overwrote the real ~/.ssh/id_rsa with a decoy), and the run still
    works and can write there."""
    key = fake_home.secrets["id_rsa"]
    before = key.read_bytes()
    target = fake_home.path if grant == "home" else key.parent
    # (a write into ~/.ssh itself is refused by the rules as persistence: only the home's top here)
    command = f"echo written > {target}/made-by-run" if grant == "home" else "true"
    r = pg.cli(["run", "--isolation", "ns", "--allow-write", str(target), "--", "sh", "-c", command],
               cwd=work, env=fake_home.env())
    assert r.report is not None, r.stderr
    assert key.read_bytes() == before, "the real key was overwritten"
    assert not [p for p in target.rglob("*") if b"pipguard-decoy" in (p.read_bytes() if p.is_file() else b"")]
    assert r.returncode == 0, r.stderr
    if grant == "home":
        assert (target / "made-by-run").read_text() == "written\n"


def test_home_at_tmp_keeps_tmp_writable(work, fake_home):
    """HOME=/tmp (CI, service units): the namespace's own /tmp stays the build's to write."""
    env = dict(fake_home.env(), HOME="/tmp")
    r = pg.cli(["run", "--isolation", "ns", "--", "sh", "-c", "echo x > /tmp/x && cat /tmp/x"], cwd=work, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("x"), r.stderr


LONG_PATH = textwrap.dedent("""
    import os, sys
    root = sys.argv[1]
    os.chdir(root)
    seg, depth = "d" * 200, 12  # 2 x 12 x 201 > PATH_MAX (4096) whatever the root's length
    for chain in ("A", "B"):
        os.mkdir(chain); os.chdir(chain)
        for _ in range(depth):
            os.mkdir(seg); os.chdir(seg)
        if chain == "A":
            with open("hidden.txt", "w") as fh:
                fh.write("hidden")
        os.chdir(root)
    os.chdir("B/" + "/".join([seg] * depth))
    os.rename("../" * (depth + 1) + "A", "A")  # A's file is now more than PATH_MAX below the root
    print("moved")
""")


def test_a_write_root_too_long_to_list_is_a_finding(work, fake_home, tmp_path):
    """A build that moves what it wrote deeper than PATH_MAX below a write root (two short
    renames) is not silently missing from files_written: the directory the snapshot could not
    list is a finding (``unlisted-files``)."""
    out = tmp_path / "out"
    out.mkdir()
    script = work / "long_path.py"
    script.write_text(LONG_PATH)
    r = pg.cli(["run", "--isolation", "ns", "--allow-write", str(out), "--", sys.executable, str(script), str(out)],
               cwd=work, env=fake_home.env())
    assert "moved" in r.stdout, (r.stdout, r.stderr)
    unlisted = [e for e in r.report["events"] if e["rule"] == "unlisted-files"]
    assert unlisted and unlisted[0]["action"] == "blocked", r.report["events"]
    assert r.report["verdict"] == "blocked"

"""Evidence: the exact report entries ``pipguard run --isolation os`` writes for real commands.

Processes with parent links, argv and exit codes; blocked and allowed network attempts with
their destination; blocked reads and writes with their target; files written with sha256 and
size; daemons killed when the command ends; signals, timeouts and a fork bomb. The fork bomb
runs last (it is the one test that loads the machine; it is bounded twice: by pipguard's
process limit and timeout, and by a deadline the bomb itself obeys).
"""

from __future__ import annotations

import hashlib
import os
import resource
import sys
import textwrap
import time


import pg
from support import requires

PY = sys.executable
pytestmark = [requires("linux"), requires("landlock", abi=6), requires("seccomp_user_notif")]


def run_os(argv, work, home, *extra, env_extra=None, timeout=180, backend=pg.PLAIN):
    return pg.run_os(argv, work, home, *extra, env_extra=env_extra, timeout=timeout, complete=True,
                     backend=backend)


def by_pid(report):
    return {p["pid"]: p for p in report["processes"]}


def sleeps(seconds: str):
    return [a for a in pg.live_argvs() if a[-2:] == ["sleep", seconds] or a == ["sleep", seconds]]


# --- processes -----------------------------------------------------------------------------------


def test_nested_shells_parent_links_argv_exit_codes(work, fake_home, backend):
    r = run_os(["sh", "-c", 'sh -c "/bin/echo a b"'], work, fake_home, backend=backend)
    assert r.returncode == 0 and r.stdout == "a b\n"
    procs = r.report["processes"]
    # the command's process is the first record on both backends (under ns it runs below
    # pipguard's pid 1, which is not listed; the first process that waits for it is not either)
    assert [p["argv"] for p in procs] == [["sh", "-c", 'sh -c "/bin/echo a b"'],
                                          ["sh", "-c", "/bin/echo a b"],
                                          ["/bin/echo", "a", "b"]], procs
    outer, inner, echo = procs
    assert inner["ppid"] == outer["pid"]
    assert echo["ppid"] == inner["pid"]
    assert outer["ppid"] not in (outer["pid"], inner["pid"], echo["pid"])  # pipguard's launcher
    assert [p["exit_code"] for p in procs] == [0, 0, 0]
    assert not any(p["killed_by_pipguard"] for p in procs)
    execs = [e for e in r.report["events"] if e["kind"] == "process" and e["rule"] == "exec"]
    # the launcher's own exec of the command is its record, not an event
    assert [e["detail"]["argv"] for e in execs] == [p["argv"] for p in procs[1:]]
    assert execs[-1]["detail"]["path"] == "/bin/echo" and execs[-1]["pid"] == echo["pid"]


def test_exit_codes_of_children(work, fake_home):
    r = run_os(["sh", "-c", "sh -c 'exit 3'; /bin/false; exit 5"], work, fake_home)
    assert r.returncode == 5 and r.report["exit_code"] == 5
    codes = [(p["argv"][:1], p["exit_code"]) for p in r.report["processes"]]
    assert codes == [(["sh"], 5), (["sh"], 3), (["/bin/false"], 1)], codes


# --- network -------------------------------------------------------------------------------------


@requires("linux")
def test_bash_dev_tcp_blocked_with_destination(work, fake_home, loopback_tcp, backend):
    port = loopback_tcp.port
    r = run_os(["bash", "-c", f"echo hi > /dev/tcp/127.0.0.1/{port}"], work, fake_home, backend=backend)
    assert r.returncode != 0
    time.sleep(0.3)
    assert loopback_tcp.received == []
    (event,) = [e for e in r.blocked(kind="network") if e["target"] == f"127.0.0.1:{port}"]
    assert event["layer"] == "supervisor" and event["rule"] == "network-denied"
    assert event["detail"]["syscall"] == "connect" and event["detail"]["protocol"] == "tcp"
    (attempt,) = [n for n in r.report["network"] if n["port"] == port]
    assert {"family": "inet", "protocol": "tcp", "address": "127.0.0.1", "port": port,
            "action": "blocked", "layer": "supervisor"}.items() <= attempt.items()
    assert r.report["verdict"] == "blocked"


def test_bash_dev_tcp_allowed_and_recorded(work, fake_home, loopback_tcp):
    port = loopback_tcp.port
    r = run_os(["bash", "-c", f"echo hi > /dev/tcp/127.0.0.1/{port}"], work, fake_home, "--allow-network")
    assert r.returncode == 0, r.stderr
    deadline = time.time() + 5
    while not loopback_tcp.received and time.time() < deadline:
        time.sleep(0.05)
    assert loopback_tcp.received == [b"hi\n"]
    (event,) = [e for e in r.report["events"] if e["kind"] == "network" and e["target"] == f"127.0.0.1:{port}"]
    assert event["action"] == "allowed" and event["rule"] == "network-allowed"
    assert [(n["address"], n["port"], n["protocol"], n["action"]) for n in r.report["network"]
            if n["family"] == "inet"] == [("127.0.0.1", port, "tcp", "allowed")]
    # bash without $SHELL looks the user up (getpwuid): glibc's nscd probe is the only refusal
    assert [e["rule"] for e in r.blocked()] in ([], ["nscd-probe"]), r.blocked()


def test_user_lookup_nscd_probe_is_not_a_finding(work, fake_home):
    """`id`, `ls -l`, bash without $SHELL: glibc tries nscd's unix socket on every user lookup.
    Still refused (unix sockets stay denied) and listed, but tagged ``nscd-probe``."""
    r = run_os(["sh", "-c", "id -un; ls -l /usr > /dev/null"], work, fake_home)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    rules = {e["rule"] for e in r.blocked()}
    assert rules <= {"nscd-probe"}, r.blocked()
    assert r.report["verdict"] == "clean"
    # one answer: informational, so not also a "blocked" row of the network table
    assert not [n for n in r.report["network"] if n["family"] == "unix"], r.report["network"]


def test_a_threads_attempt_is_its_process(work, fake_home):
    """A worker or resolver thread's native attempt (the kernel names the thread) is
    recorded under its process's pid, which the process list names: it showed as a
    process of its own with no name."""
    script = work / "thr.py"
    script.write_text("import ctypes, threading\nlibc = ctypes.CDLL(None)\n"
                      "t = threading.Thread(target=lambda: libc.socket(2, 2, 0))\nt.start(); t.join()\n")
    r = run_os([sys.executable, "-S", str(script)], work, fake_home)
    (event,) = [e for e in r.blocked() if e["rule"] == "socket-denied"]
    assert event["pid"] in by_pid(r.report), (event, r.report["processes"])
    assert {n["pid"] for n in r.report["network"]} <= set(by_pid(r.report))


# --- files ---------------------------------------------------------------------------------------


def test_cat_secret_blocked(work, fake_home, backend):
    secret = fake_home.secrets["id_rsa"]
    r = run_os(["cat", secret], work, fake_home, backend=backend)
    if backend.ns:  # cat gets the decoy (the real home is not there): reported all the same
        assert r.returncode == 0
        pg.assert_decoy_read(r, fake_home, "id_rsa", secret)
        return
    assert r.returncode == 1 and "Permission denied" in r.stderr
    assert fake_home.markers["id_rsa"] not in r.stdout
    (event,) = r.blocked(kind="file-read")
    assert event["target"] == str(secret) and event["rule"] == "secret-read"
    assert event["layer"] == "supervisor" and event["pid"] == r.report["processes"][0]["pid"]


def test_cat_tilde_secret_blocked(work, fake_home):
    """``~`` inside is the sandbox's own empty HOME; the real one is named in the report."""
    r = run_os(["sh", "-c", f"cat ~/.ssh/id_rsa; cat {fake_home.path}/.ssh/id_rsa"], work, fake_home)
    assert fake_home.markers["id_rsa"] not in r.stdout
    assert str(fake_home.secrets["id_rsa"]) in r.targets(kind="file-read")


def test_append_bashrc_blocked(work, fake_home, backend):
    r = run_os(["sh", "-c", f"echo x >> {fake_home.bashrc}"], work, fake_home, backend=backend)
    assert r.returncode != 0
    assert fake_home.bashrc.read_text() == fake_home.bashrc_original
    (event,) = r.blocked(kind="file-write")
    assert event["target"] == str(fake_home.bashrc)
    assert event["rule"] in ("persistence", "write-outside-roots")
    assert event["layer"] == "supervisor"


def test_files_written_in_allowed_root(work, fake_home, tmp_path, backend):
    out = tmp_path / "out"
    out.mkdir()
    payload = b"payload of known size\n" * 7
    cmd = (f"printf '%s' '{payload.decode()}' > {out}/data.bin; mkdir -p {out}/sub; "
           f"printf 'abc' > {out}/sub/x; printf 'built' > built.txt")
    r = run_os(["sh", "-c", cmd], work, fake_home, "--allow-write", out, backend=backend)
    assert r.returncode == 0, r.stderr
    written = {f["path"]: f for f in r.report["files_written"]}
    assert written[str(out / "data.bin")] == {"path": str(out / "data.bin"), "size": len(payload),
                                              "sha256": hashlib.sha256(payload).hexdigest(),
                                              "discarded": False}  # on the host: it stays
    assert written[str(out / "sub" / "x")]["sha256"] == hashlib.sha256(b"abc").hexdigest()
    assert str(work / "built.txt") not in written  # the build dir is recorded only on request

    r = run_os(["sh", "-c", cmd], work, fake_home, "--allow-write", out, "--record-build-dir", backend=backend)
    written = {f["path"]: f for f in r.report["files_written"]}
    assert written[str(work / "built.txt")] == {"path": str(work / "built.txt"), "size": 5,
                                                "sha256": hashlib.sha256(b"built").hexdigest(),
                                                "discarded": False}


# --- lifetime ------------------------------------------------------------------------------------


def _assert_daemon_gone(r, argv_expected=None):
    killed = [p for p in r.report["processes"] if p["killed_by_pipguard"]]
    assert killed, r.report["processes"]
    assert all(p["exit_code"] == -9 and p["ppid"] > 0 and p["argv"] for p in killed), killed
    root = r.report["processes"][0]
    assert not root["killed_by_pipguard"] and root["exit_code"] == 0
    if argv_expected is not None:
        assert argv_expected in [p["argv"] for p in killed], killed
    for p in killed:
        assert not os.path.exists(f"/proc/{p['pid']}/stat") or \
            open(f"/proc/{p['pid']}/stat").read().split(") ")[1][0] == "Z"


def test_daemon_setsid_background_killed(work, fake_home, backend):
    # a duration no other program on the machine sleeps for: `sleeps` looks at every process
    marker = "300.0417"
    assert not sleeps(marker), "a stale `sleep 300.0417` is running; cannot test"
    r = run_os(["sh", "-c", "(setsid sleep 300.0417 &) ; exit 0"], work, fake_home, timeout=60, backend=backend)
    assert r.returncode == 0 and r.report["exit_code"] == 0
    _assert_daemon_gone(r)
    assert not sleeps(marker)


def test_daemon_that_is_running_is_killed_and_named(work, fake_home):
    assert not sleeps("300.0417")
    r = run_os(["sh", "-c", "(setsid sleep 300.0417 &) ; sleep 0.5; exit 0"], work, fake_home, timeout=60)
    assert r.returncode == 0
    _assert_daemon_gone(r, ["sleep", "300.0417"])
    daemon = [p for p in r.report["processes"] if p["argv"] == ["sleep", "300.0417"]][0]
    assert daemon["ppid"] != 0
    assert not sleeps("300.0417")


def test_python_double_fork_daemon_killed(work, fake_home):
    script = work / "daemon.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "300.0417"])
            os._exit(0)
        time.sleep(0.5)
        print("parent done", flush=True)
    """))
    assert not sleeps("300.0417")
    r = run_os([PY, script], work, fake_home, timeout=60)
    assert r.returncode == 0 and "parent done" in r.stdout, r.stderr
    _assert_daemon_gone(r, ["sleep", "300.0417"])
    assert not sleeps("300.0417")


def test_command_sigkills_itself(work, fake_home, backend):
    """Under ns the first process F ends with the command's status: killed by the same signal
    (it once exited 137 instead: SIGKILL has no handler to reset, which skipped the kill)."""
    r = run_os(["sh", "-c", "kill -9 $$"], work, fake_home, backend=backend)
    assert r.returncode == 137
    assert r.report["exit_code"] == -9 and not r.report["timed_out"]
    root = r.report["processes"][0]
    assert root["exit_code"] == -9 and not root["killed_by_pipguard"]
    assert not r.blocked(kind="signal")  # a signal to itself is not a finding


def test_timeout(work, fake_home, backend):
    r = run_os(["sh", "-c", "sleep 31; echo never"], work, fake_home, "--timeout", "1", timeout=60, backend=backend)
    assert r.returncode == 124 and r.report["timed_out"] is True
    assert "never" not in r.stdout
    root = r.report["processes"][0]
    assert root["exit_code"] == -9 and root["killed_by_pipguard"]
    assert not sleeps("31"), "the tree outlived the timeout"


def test_timeout_plain_sleep(work, fake_home):
    # a duration no other process on the machine has (another session's, a shell loop's `sleep 30`)
    duration = f"30.{os.getpid()}{time.monotonic_ns() % 1000:03d}"
    r = run_os(["sleep", duration], work, fake_home, "--timeout", "1", timeout=60)
    assert r.returncode == 124 and r.report["timed_out"] is True and r.report["exit_code"] == -9
    assert not [a for a in pg.live_argvs() if a == ["sleep", duration]]


def test_event_list_is_capped(work, fake_home):
    script = work / "flood.py"
    script.write_text(textwrap.dedent("""
        import os
        for i in range(21000):  # each a refusal (a finding): past both allowances
            try:
                open("/pipguard-flood-%d" % i, "w")
            except OSError:
                pass
        print("done", flush=True)
    """))
    r = run_os([PY, script], work, fake_home, timeout=120)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-2000:]
    report = r.report
    cap = report["policy"]["max_events"]
    # findings get a second allowance of max_events (a flood must not push a refusal out:
    # test_install_attacks.py::test_event_flood_cannot_hide_a_blocked_attempt)
    assert len(report["events"]) == 2 * cap
    assert report["events_dropped"] >= 21000 - 2 * cap
    assert [e["seq"] for e in report["events"]] == list(range(1, 2 * cap + 1))
    assert not any(name.startswith("pipguard-flood-") for name in os.listdir("/"))


# --- the fork bomb: keep it last -----------------------------------------------------------------


def test_zz_fork_bomb_is_bounded(work, fake_home):
    # Guarded: every process stops forking and exits at a deadline inherited from the first one,
    # so even a pipguard that failed to contain it would clean up after itself.
    script = work / "bomb.py"
    script.write_text(textwrap.dedent("""
        import os, time
        deadline = time.time() + 20
        forking = True
        while time.time() < deadline:
            if forking:
                try:
                    os.fork()
                    continue
                except OSError:
                    forking = False  # the limit is reached: now flood the event channel
            try:  # a distinct blocked event per attempt: overflows the event list
                open("/pipguard-bomb-%d-%f" % (os.getpid(), time.time()), "w")
            except OSError:
                pass
        os._exit(0)
    """))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.monotonic()
    r = run_os([PY, "-I", script], work, fake_home, "--timeout", "10", "--limit-processes", "300",
               timeout=120)  # a low limit: reached in time even on a loaded machine
    elapsed = time.monotonic() - started
    report = r.report
    assert report["timed_out"] is True and r.returncode == 124
    limit = report["policy"]["limit_processes"]
    assert r.blocked(kind="process", rule="limit-processes"), report["events"][:5]
    # the findings allowance, plus the few limit events that are kept past every cap
    assert len(report["events"]) <= 2 * report["policy"]["max_events"] + 10
    assert len(report["processes"]) <= report["policy"]["max_events"] + limit
    print({"events": len(report["events"]), "dropped": report["events_dropped"],
           "processes": len(report["processes"]), "elapsed": round(elapsed, 1)})
    if len(report["events"]) == 2 * report["policy"]["max_events"]:
        assert report["events_dropped"] > 0
    # pipguard itself stayed small (max RSS of our children: the CLI and whatever it reaped)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kb < 512 * 1024, (before, peak_kb)
    time.sleep(0.5)
    assert not [a for a in pg.live_argvs() if a[-1:] == [str(script)]], "bomb processes survived"


def test_host_name_of_a_preceding_dns_lookup(work, fake_home, loopback_tcp):
    """With network allowed, a connect is reported with the name a lookup gave for its address."""
    code = (f"import socket; s = socket.create_connection(('localhost', {loopback_tcp.port})); "
            "s.sendall(b'hi'); s.close()")
    r = run_os([sys.executable, "-c", code], work, fake_home, "--allow-network")
    assert r.returncode == 0, r.stderr
    inet = [n for n in r.report["network"] if n["port"] == loopback_tcp.port]
    assert inet and all(n["host"] == "localhost" for n in inet), r.report["network"]

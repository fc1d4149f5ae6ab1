"""The gate judges what pip really installs (issue 33): member names as pip normalises them, a
built wheel that says what pip resolved from, and nothing a refused build made left in pip's
wheel cache. Real pip, real sdists built here, both routes (loopback index with credentials,
--find-links)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support import build_sdist
from support.handbackend import write_hand_project
from support.pipinstall import listing, make_venv, pg_install, pip_list
from support.wheels import NSPKG_LINE, make_wheel

HOOK_PTH = "import sys\n"  # a start-up hook line (harmless), which the gate refuses


def _cached_wheels(home, name):
    cache = Path(home.path) / ".cache" / "pip" / "wheels"
    return sorted(p for p in cache.rglob("*.whl") if p.name.startswith(name)) if cache.exists() else []


def _plain_pip(python, route, env, cwd, *args) -> None:
    """The same install through plain pip: what happens without pipguard."""
    done = subprocess.run([str(python), "-m", "pip", "install", *route.args(), *args], env=env,
                          capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, done.stderr[-2000:]


def _refused_unchanged(args, *, watched, **install) -> dict:
    """``pipguard install ARGS`` refused (exit 1), ``watched`` (a venv, a --target directory)
    byte for byte as it was; the report."""
    before = listing(watched)
    proc, report = pg_install(args, **install)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(watched) == before
    assert report is not None, proc.stderr[-3000:]
    return report


def _findings(report, rule):
    return [f for p in report["packages"] for f in p["findings"] if f["rule"] == rule]


def _refusals(report, rule):
    return [r for r in report["refusals"] if any(s.startswith(rule) or f"{rule}:" in s or f"({rule})" in s
                                                  for s in r["seen"])]


@pytest.mark.parametrize("form", ["downloaded", "built"])
def test_a_member_spelled_to_skip_the_gate_is_refused(form, tmp_path, fake_home, route, target):
    """`./x.pth` lands as site-packages/x.pth: a start-up hook. Downloaded (a wheel on the index)
    and built (the quiet form: an sdist whose build ships it in the wheel it returns)."""
    extra = route.add(tmp_path / "extra")
    members = {"./hand_hook.pth": HOOK_PTH, "handpkg/__init__.py": ""}
    if form == "downloaded":
        make_wheel(extra, {k: v.encode() for k, v in members.items()}, name="handpkg")
    else:
        build_sdist(write_hand_project(tmp_path / "src", "handpkg", members=members), extra)
    report = _refused_unchanged(["handpkg"], watched=target, home=fake_home, target=target, route=route, cwd=tmp_path)
    assert not list(target.glob("lib/python*/site-packages/hand_hook.pth"))
    assert _refusals(report, "pth-exec"), report["refusals"]
    assert not _cached_wheels(fake_home, "handpkg")


@pytest.mark.parametrize("built_requires", [["extradep"], ["leak @ http://127.0.0.1:{port}/data"]],
                         ids=["name", "url"])
def test_a_wheel_unlike_its_prepared_metadata_is_refused(built_requires, tmp_path, fake_home, route, target,
                                                          loopback_tcp):
    """prepare_metadata says no dependency (what pip resolves); build_wheel's METADATA adds one —
    by name (installed from pip's cache next time) or by URL carrying data (fetched by pip,
    unsandboxed, the next time). Plain pip installs the wheel; pipguard refuses at the build."""
    extra = route.add(tmp_path / "extra")
    requires = [r.format(port=loopback_tcp.port) for r in built_requires]
    build_sdist(write_hand_project(tmp_path / "src", "handmeta", members={"handmeta/__init__.py": ""},
                                   built_requires=requires), extra)
    report = _refused_unchanged(["handmeta"], watched=target, home=fake_home, target=target, route=route, cwd=tmp_path)
    assert any(r["kind"] == "output" and any("metadata-mismatch" in s for s in r["seen"])
               for r in report["refusals"]), report["refusals"]
    assert not _cached_wheels(fake_home, "handmeta")
    assert not loopback_tcp.received
    # plain pip, same arguments: installs the wheel whose metadata it never resolved
    env = fake_home.env(route.env())
    _plain_pip(target / "bin" / "python", route, env, tmp_path, "handmeta")
    assert "handmeta" in pip_list(target)


def test_an_honest_build_keeps_its_wheel_in_pips_cache(tmp_path, fake_home, links, target):
    """What the gate passed stays in pip's cache, as pip left it."""
    extra = links.add(tmp_path / "extra")
    build_sdist(write_hand_project(tmp_path / "src", "handok", members={"handok/__init__.py": "X = 1\n"},
                                   prepared_requires=["six"]), extra)
    proc, report = pg_install(["--no-deps", "handok"], home=fake_home, target=target, route=links,
                              cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "handok" in pip_list(target)
    assert len(_cached_wheels(fake_home, "handok")) == 1


def test_a_url_in_a_cached_wheel_is_refused(tmp_path, fake_home, links, wheelhouse):
    """A wheel an earlier plain pip built and cached, whose METADATA names a URL its prepared
    metadata did not: pipguard gates it like any wheel, and the URL refuses it (high)."""
    extra = links.add(tmp_path / "extra")
    dep = make_wheel(tmp_path, {"leakdep/__init__.py": b""}, name="leakdep")
    requires = [f"leakdep @ {Path(dep).as_uri()}"]
    build_sdist(write_hand_project(tmp_path / "src", "handcache", members={"handcache/__init__.py": ""},
                                   built_requires=requires), extra)
    first = make_venv(tmp_path / "first", "bundled", wheelhouse)
    env = fake_home.env()
    _plain_pip(first / "bin" / "python", links, env, tmp_path, "handcache")
    assert _cached_wheels(fake_home, "handcache"), "plain pip did not cache its build"
    target = make_venv(tmp_path / "target", "bundled", wheelhouse)
    report = _refused_unchanged(["handcache"], watched=target, home=fake_home, target=target, route=links, cwd=tmp_path)
    found = _findings(report, "direct-reference")
    assert found and found[0]["severity"] == "high" and "cache" in found[0]["message"], report["packages"]


@pytest.mark.parametrize("form", ["downloaded", "built"])
def test_a_package_beside_another_distributions_module_is_refused(form, tmp_path, fake_home, route, target):
    """`othmod/__init__.py` beside another distribution's `othmod.py` overwrites no file, yet
    Python's finder takes the package: every `import othmod` runs the new code."""
    extra = route.add(tmp_path / "extra")
    make_wheel(extra, {"othmod.py": b"VALUE = 'original'\n"}, name="othmod")
    env = fake_home.env(route.env())
    _plain_pip(target / "bin" / "python", route, env, tmp_path, "othmod")
    members = {"othmod/__init__.py": "VALUE = 'taken over'\n", "takeover/__init__.py": ""}
    if form == "downloaded":
        make_wheel(extra, {k: v.encode() for k, v in members.items()}, name="takeover")
    else:
        build_sdist(write_hand_project(tmp_path / "src", "takeover", members=members), extra)
    report = _refused_unchanged(["takeover"], watched=target, home=fake_home, target=target, route=route, cwd=tmp_path)
    found = _findings(report, "shadows-other")
    assert found and found[0]["severity"] == "critical", report["packages"]


def test_namespace_packages_shared_by_two_distributions_pass(tmp_path, wheelhouse):
    """Two distributions filling one PEP 420 namespace (`nsx/a`, `nsx/b`) are no shadowing."""
    from pipguard.gate import scan as gate
    from pipguard.gate.ownership import target_layout

    venv = make_venv(tmp_path / "venv", "bundled", wheelhouse)
    first = make_wheel(tmp_path, {"nsx/a/__init__.py": b""}, name="nsx_a")
    env = {"PATH": os.environ["PATH"], "PIP_CONFIG_FILE": os.devnull}
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", str(first)],
                   check=True, env=env)
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    second = make_wheel(tmp_path / "b", {"nsx/b/__init__.py": b""}, name="nsx_b")
    third = make_wheel(tmp_path / "c", {"nsx/c/__init__.py": b""}, name="nsx_c")
    layout = target_layout(str(venv / "bin" / "python"))
    assert gate.check_ownership([gate.WheelToInstall(str(second)), gate.WheelToInstall(str(third))],
                                layout) == []


def test_a_target_upgrade_that_would_delete_another_distributions_package_is_refused(
        tmp_path, fake_home, route, any_pip_target):
    """`pip install --target DIR --upgrade` removes every top-level entry of DIR it moves in,
    whole. A quiet build needs no blocked attempt: its wheel ships one new file below another
    distribution's package (`victim/api.py`), overwriting nothing, and pip would delete `victim/`
    and put that file in its place. Refused with `overwrites-other`, DIR unchanged; plain pip
    does delete it (the attack is real), and without --upgrade pip leaves victim/ alone."""
    extra = route.add(tmp_path / "extra")
    make_wheel(extra, {"victim/__init__.py": b"VALUE = 'original'\n"}, name="victim")
    build_sdist(write_hand_project(tmp_path / "src", "remover", members={
        "remover/__init__.py": "", "victim/api.py": "TAKEN = True\n"}), extra)
    python, env = any_pip_target / "bin" / "python", fake_home.env(route.env())
    dest, plain = tmp_path / "dest", tmp_path / "plain"
    for directory in (dest, plain):
        _plain_pip(python, route, env, tmp_path, "--target", str(directory), "victim")
    report = _refused_unchanged(["--target", str(dest), "--upgrade", "remover"], watched=dest, home=fake_home,
                                target=any_pip_target, route=route, cwd=tmp_path)
    found = _findings(report, "overwrites-other")
    assert found and found[0]["severity"] == "critical" and "victim" in found[0]["message"], report["packages"]
    # what plain pip does with the same wheel: victim's package is gone
    _plain_pip(python, route, env, tmp_path, "--target", str(plain), "--upgrade", "remover")
    assert not (plain / "victim" / "__init__.py").exists() and (plain / "victim" / "api.py").exists()
    # without --upgrade pip keeps victim/ (it warns) and the install goes ahead
    proc, report = pg_install(["--target", str(dest), "remover"], home=fake_home, target=any_pip_target,
                              route=route, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (dest / "victim" / "__init__.py").read_text() == "VALUE = 'original'\n"
    assert (dest / "remover" / "__init__.py").exists()


def test_an_nspkg_hook_over_another_distributions_package_is_refused(tmp_path, fake_home, route, any_pip_target):
    """A quiet build ships setuptools' nspkg start-up line for `victim`, the regular package
    of another installed distribution, and one file in it: recognised as the known loader by
    the scan, it would at every start put an empty, never-run `victim` in sys.modules (plain
    pip shows it: `victim.VALUE` is gone). Refused (`shadows-other`), the venv unchanged."""
    extra = route.add(tmp_path / "extra")
    make_wheel(extra, {"victim/__init__.py": b"VALUE = 'original'\n"}, name="victim")
    build_sdist(write_hand_project(tmp_path / "src", "hollow", members={
        "hollow-nspkg.pth": NSPKG_LINE.replace("NS", "victim"), "victim/extra.py": "TAKEN = True\n",
        "hollow/__init__.py": ""}), extra)
    env = fake_home.env(route.env())
    _plain_pip(any_pip_target / "bin" / "python", route, env, tmp_path, "victim")
    report = _refused_unchanged(["hollow"], watched=any_pip_target, home=fake_home, target=any_pip_target, route=route, cwd=tmp_path)
    found = _findings(report, "shadows-other")
    assert found and found[0]["severity"] == "critical" and "victim" in found[0]["message"], report["packages"]
    # what plain pip's install of the same sdist does to `import victim`
    plain = make_venv(tmp_path / "plain", "bundled", Path(str(route.dirs[0])))
    for name in ("victim", "hollow"):
        _plain_pip(plain / "bin" / "python", route, env, tmp_path, name)
    probe = subprocess.run([str(plain / "bin" / "python"), "-c", "import victim; print(victim.VALUE)"],
                           capture_output=True, text=True, env=env)
    assert probe.returncode != 0 and "VALUE" in probe.stderr, (probe.stdout, probe.stderr)

"""The test tiers (tests/conftest.py TIERS, docs/testing.md): every test module is assigned one,
the assignment means what it says, and the unit tier keeps its promise of no process."""
from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import conftest
import pytest
from support import pipinstall
from support.pipinstall import PIPS

TESTS = Path(__file__).resolve().parent


def test_every_test_module_is_assigned_a_tier():
    modules = {p.stem for p in TESTS.glob("test_*.py")}
    missing = sorted(modules - set(conftest.TIERS))
    assert not missing, f"add these modules to TIERS in tests/conftest.py: {missing}"
    stale = sorted(set(conftest.TIERS) - modules)
    assert not stale, f"TIERS names modules that are gone: {stale}"


def test_tiers_and_overrides_name_known_tiers_and_modules():
    assert set(conftest.TIERS.values()) <= set(conftest.TIER_ORDER)
    assert set(conftest.TIER_FIXTURES) <= set(conftest.TIER_ORDER)
    for key, tier in conftest.TIER_OVERRIDES.items():
        module, _, name = key.partition("::")
        assert tier in conftest.TIER_ORDER, key
        assert f"def {name}(" in (TESTS / f"{module}.py").read_text(), f"TIER_OVERRIDES: no test {key}"


def test_a_costlier_fixture_lifts_a_test_out_of_its_modules_tier():
    assert conftest.tier_of("test_gate", "t", ["tmp_path"], set()) == "unit"
    assert conftest.tier_of("test_gate", "t", ["wheelhouse", "tmp_path"], set()) == "install"
    assert conftest.tier_of("test_gate", "t", ["fake_home"], {"network_index"}) == "slow"
    assert conftest.tier_of("test_install", "t", ["fake_home"], set()) == "install"  # never lowered


def test_an_unknown_module_is_tiered_by_its_fixtures():
    assert conftest.tier_of("test_new", "t", ["target"], set()) == "install"
    assert conftest.tier_of("test_new", "t", ["backend"], set()) == "sandbox"
    assert conftest.tier_of("test_new", "t", ["tmp_path"], set()) == conftest.UNKNOWN_MODULE_TIER != "unit"


def test_every_collected_test_has_exactly_one_tier(request):
    for item in request.session.items:
        tiers = [t for t in conftest.TIER_ORDER if item.get_closest_marker(t)]
        assert len(tiers) == 1, (item.nodeid, tiers)


def test_the_unit_guard_sees_a_process_started():
    guard = conftest._UnitSpawnGuard()
    guard.watching = True
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    finally:
        guard.watching = False
    assert any(s.startswith("subprocess.Popen") for s in guard.seen), guard.seen


def test_markers_are_registered(pytestconfig):
    registered = {line.split(":")[0].split("(")[0].strip() for line in pytestconfig.getini("markers")}
    assert set(conftest.TIER_ORDER) <= registered


# --- what the speed-ups must keep ------------------------------------------------------------------

def _tree(venv: Path) -> dict:
    """path -> (mode, content) for each entry; bytecode by its header and whether it is valid for
    its source (mtime and size): its code names the directory pip compiled it in, which the import
    system puts right on load, and its mtime is when pip wrote the source."""
    out = {}
    for path in sorted(venv.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            content = b"link:" + os.readlink(path).encode()
        elif path.is_dir():
            content = b"dir"
        else:
            content = path.read_bytes()
            if path.suffix == ".pyc":
                source = os.stat(importlib.util.source_from_cache(str(path)))
                valid = content[8:16] == struct.pack("<II", int(source.st_mtime) & 0xFFFFFFFF, source.st_size)
                content = content[:8] + content[12:16] + (b"valid" if valid else b"stale")
        out[str(path.relative_to(venv))] = (st.st_mode, content)
    return out


@pytest.mark.parametrize("pip", PIPS)
def test_a_venv_from_the_template_is_the_venv_pip_makes(pip, tmp_path, wheelhouse):
    """support.pipinstall.make_venv copies pip from a template venv: at the same path, the venv is
    the one ``python -m venv`` (+ ``pip install pip==<pip>``) makes."""
    path = tmp_path / "v"
    pipinstall._make_venv_with_pip(path, pip, wheelhouse)
    expected = _tree(path)
    shutil.rmtree(path)
    pipinstall.make_venv(path, pip, wheelhouse)
    got = _tree(path)
    assert sorted(got) == sorted(expected)
    differ = [name for name in expected if got[name] != expected[name]]
    assert not differ, differ[:10]
    subprocess.run([str(path / "bin" / "pip"), "--version"], check=True, stdout=subprocess.DEVNULL)


def _matrix_keys() -> dict:
    """axis -> the keys (conftest.matrix_key) of every test case pairing that axis with the pip."""
    found: dict = {axis: [] for axis in conftest.PAIRED_WITH_PIP}
    for item in _all_items():
        params = getattr(getattr(item, "callspec", None), "params", {})
        for axis in conftest.PAIRED_WITH_PIP:
            if axis in params and "any_pip_target" in params:
                found[axis].append(conftest.matrix_key(item.nodeid.partition("[")[0], params, axis))
                break
    return {axis: sorted(set(keys)) for axis, keys in found.items()}


_COLLECTED: list = []


def _all_items() -> list:
    """Every test of the suite, collected in a child pytest (names and parameters only)."""
    if not _COLLECTED:
        import json

        code = ("import json, sys, pytest\n"
                "class P:\n"
                "    def pytest_collection_modifyitems(self, items):\n"
                "        out = [(i.nodeid, getattr(getattr(i, 'callspec', None), 'params', {})) for i in items]\n"
                "        print('ITEMS=' + json.dumps(out, default=str))\n"
                "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', sys.argv[1]], plugins=[P()]))\n")
        env = {k: v for k, v in os.environ.items() if k != "PIPGUARD_FULL_MATRIX"}
        out = subprocess.run([sys.executable, "-c", code, str(TESTS)], capture_output=True, text=True,
                             cwd=TESTS.parent, env=env).stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("ITEMS="))
        _COLLECTED.extend(_Item(nodeid, params) for nodeid, params in json.loads(line[len("ITEMS="):]))
    return _COLLECTED


class _Item:
    def __init__(self, nodeid, params):
        self.nodeid, self.callspec = nodeid, type("CallSpec", (), {"params": params})()


def test_the_matrix_keeps_both_values_and_pips_per_test_and_every_pair_in_the_suite():
    """Pairwise, not fewer: each test runs both pips and both values of its axis, and the
    suite runs every (value, pip) pair somewhere."""
    for axis, keys in _matrix_keys().items():
        values = conftest.PAIRED_WITH_PIP[axis]
        assert len(keys) >= 5, (axis, keys)
        for key in keys:
            pairs = conftest.matrix_pairs(key, values)
            assert {v for v, _ in pairs} == set(values) and {p for _, p in pairs} == set(PIPS), (key, pairs)
        assert set().union(*(conftest.matrix_pairs(k, values) for k in keys)) == {
            (v, p) for v in values for p in PIPS}, axis


def test_collected_matrix_tests_run_their_pairs_only(request):
    """What this session runs is the matrix (all four pairs with PIPGUARD_FULL_MATRIX=1), and the
    filter drops exactly the two pairs a test does not run."""
    if conftest.FULL_MATRIX:
        pytest.skip("PIPGUARD_FULL_MATRIX=1: every pair runs")
    ran = [item for item in request.session.items if conftest._off_the_matrix(item)]
    assert not ran, [item.nodeid for item in ran]
    test, routes = "tests/test_x.py::test_y", conftest.PAIRED_WITH_PIP["route"]
    off = {(r, p) for r in routes for p in PIPS
           if conftest._off_the_matrix(_Item(test, {"route": r, "any_pip_target": p, "other": 1}))}
    kept = conftest.matrix_pairs(conftest.matrix_key(test, {"other": 1}, "route"), routes)
    assert len(off) == 2 and not off & kept

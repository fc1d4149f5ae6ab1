"""The gate's remembered findings (pipguard/gate/cache.py): same bytes and name, same answer,
without scanning again; anything else is scanned. The attacker's move this guards against: a
wheel that was clean once, swapped for a malicious one under the same file name."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from pipguard.gate import cache as gatecache
from pipguard.sandbox.files import sha256
from support.wheels import EVIL_PTH, make_wheel


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("PIPGUARD_CACHE_DIR", str(directory))
    return directory


def _entries(cache: Path):
    return sorted((cache / "gate").glob("*/*.json"))


def test_a_scanned_wheel_is_answered_from_the_cache(tmp_path, private_cache):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo-hook.pth": EVIL_PTH})
    first = gatecache.scan_wheel(str(whl), sha256(str(whl)))
    assert [f.rule for f in first] == ["pth-exec"]
    (entry,) = _entries(private_cache)
    assert entry.name.startswith(sha256(str(whl)))
    # The second answer comes from the entry (a planted extra finding shows it), not a scan.
    data = json.loads(entry.read_text())
    data["findings"].append({**data["findings"][0], "rule": "from-the-cache"})
    entry.write_text(json.dumps(data))
    again = gatecache.scan_wheel(str(whl), sha256(str(whl)))
    assert [f.rule for f in again] == ["pth-exec", "from-the-cache"]


def test_a_clean_wheel_swapped_for_a_malicious_one_is_scanned_again(tmp_path):
    clean_dir, evil_dir = tmp_path / "clean", tmp_path / "evil"
    clean_dir.mkdir()
    evil_dir.mkdir()
    clean = make_wheel(clean_dir, {"demo/__init__.py": b""})
    evil = make_wheel(evil_dir, {"demo/__init__.py": b"", "demo-hook.pth": EVIL_PTH})
    assert clean.name == evil.name  # the same file name, other bytes
    assert gatecache.scan_wheel(str(clean), sha256(str(clean))) == ()
    findings = gatecache.scan_wheel(str(evil), sha256(str(evil)))
    assert [f.rule for f in findings] == ["pth-exec"]


def test_the_same_bytes_under_another_name_or_project_are_scanned_again(tmp_path, private_cache):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo-hook.pth": EVIL_PTH})
    digest = sha256(str(whl))
    gatecache.scan_wheel(str(whl), digest)
    renamed = tmp_path / "other" / "demo2-1.0-py3-none-any.whl"
    renamed.parent.mkdir()
    renamed.write_bytes(whl.read_bytes())
    findings = gatecache.scan_wheel(str(renamed), digest)
    assert {f.artifact for f in findings} == {renamed.name}  # findings name their artifact
    gatecache.scan_wheel(str(whl), digest, editable_project=str(tmp_path))
    assert len(_entries(private_cache)) == 3


def test_an_unreadable_entry_is_scanned_again(tmp_path, private_cache):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo-hook.pth": EVIL_PTH})
    gatecache.scan_wheel(str(whl), sha256(str(whl)))
    (entry,) = _entries(private_cache)
    entry.write_text("{not json")
    assert [f.rule for f in gatecache.scan_wheel(str(whl), sha256(str(whl)))] == ["pth-exec"]
    assert json.loads(entry.read_text())["findings"][0]["rule"] == "pth-exec"  # and rewritten


def test_a_cache_others_may_write_is_not_used(tmp_path, private_cache):
    """Another user could plant entries saying a malicious wheel is clean: such a directory
    is ignored (every wheel is scanned) rather than trusted."""
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo-hook.pth": EVIL_PTH})
    private_cache.mkdir(mode=0o700)
    os.chmod(private_cache, 0o777)
    code = gatecache._deciding_code()
    planted = private_cache / "gate" / code
    planted.mkdir(parents=True)
    name = hashlib.sha256(f"{whl.name}\0".encode()).hexdigest()[:16]
    (planted / f"{sha256(str(whl))}-{name}.json").write_text(json.dumps({"findings": []}))
    assert [f.rule for f in gatecache.scan_wheel(str(whl), sha256(str(whl)))] == ["pth-exec"]


def test_findings_of_other_gate_code_are_removed(tmp_path, private_cache):
    whl = make_wheel(tmp_path, {"demo/__init__.py": b""})
    stale = private_cache / "gate" / "code-that-is-gone"
    stale.mkdir(parents=True, mode=0o700)
    os.chmod(private_cache, 0o700)
    os.chmod(private_cache / "gate", 0o700)
    (stale / "x.json").write_text(json.dumps({"findings": []}))
    gatecache.scan_wheel(str(whl), sha256(str(whl)))
    assert not stale.exists()
    assert [p.parent.name for p in _entries(private_cache)] == [gatecache._deciding_code()]


def test_a_wheel_built_in_this_run_is_not_remembered(tmp_path, private_cache):
    """Its bytes are new at every build (timestamps): an entry would never be read again."""
    whl = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo-hook.pth": EVIL_PTH})
    findings = gatecache.scan_wheel(str(whl), sha256(str(whl)), remember=False)
    assert [f.rule for f in findings] == ["pth-exec"] and _entries(private_cache) == []


def test_the_cache_is_bounded(tmp_path, private_cache, monkeypatch):
    monkeypatch.setattr(gatecache, "MAX_ENTRIES", 4)
    for i in range(6):
        directory = tmp_path / str(i)
        directory.mkdir()
        whl = make_wheel(directory, {"demo/__init__.py": str(i).encode()})
        gatecache.scan_wheel(str(whl), sha256(str(whl)))
    assert 2 <= len(_entries(private_cache)) <= 4


def test_the_cache_key_covers_every_module_the_rules_import():
    """A cached answer is keyed by the code that decided it: every pipguard.gate module the rules
    import, at any depth (wheelpaths.py, where a member lands, was once left out of the key)."""
    import ast

    gate_dir = Path(gatecache.__file__).parent
    hashed = {Path(p).name for p in gatecache.deciding_files()}
    seen, todo = set(), ["scan.py"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(ast.parse((gate_dir / name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "pipguard.gate":
                todo += [f"{alias.name}.py" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipguard.gate."):
                todo.append(node.module.split(".")[2] + ".py")
    assert {"scan.py", "startup.py", "wheelpaths.py", "pthshapes.py", "findings.py"} <= seen
    assert seen <= hashed, seen - hashed

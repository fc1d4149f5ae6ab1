"""Host facts and doctor checks on the real machine.

Gated like the OS-layer tests: what this host lacks is skipped, or failed under
PIPGUARD_REQUIRE_ALL_LAYERS=1.
"""

from __future__ import annotations

import json
import os
import platform

import pytest

from pipguard.cli import doctor_checks as doctor
from pipguard.sandbox import host

STRICT = os.environ.get("PIPGUARD_REQUIRE_ALL_LAYERS", "") == "1"


def _need(ok: bool, why: str) -> None:
    if ok:
        return
    if STRICT:
        pytest.fail(f"{why} (PIPGUARD_REQUIRE_ALL_LAYERS=1)", pytrace=False)
    pytest.skip(why)


def test_probe_is_cached_and_json_serialisable() -> None:
    facts = host.probe()
    assert host.probe() is facts
    data = json.loads(json.dumps(facts.to_json()))
    assert data["system"] == platform.system() and data["euid"] == os.geteuid()
    assert host.probe(refresh=True) == facts


def test_probe_linux_facts() -> None:
    facts = host.probe()
    _need(facts.system == "Linux", "Linux only")
    _need(facts.landlock_abi >= 1, f"Landlock missing: {facts.landlock_reason}")
    assert facts.landlock_reason == ""
    assert {"READ_FILE", "WRITE_FILE", "EXECUTE", "READ_DIR"} <= set(facts.landlock_fs_rights)
    assert ("REFER" in facts.landlock_fs_rights) == (facts.landlock_abi >= 2)
    assert ("IOCTL_DEV" in facts.landlock_fs_rights) == (facts.landlock_abi >= 5)
    assert facts.landlock_net == (facts.landlock_abi >= 4)
    assert facts.landlock_scope == (facts.landlock_abi >= 6)
    _need(facts.seccomp, f"seccomp missing: {facts.seccomp_reason}")
    _need(facts.seccomp_notify, f"seccomp notify missing: {facts.seccomp_notify_reason}")
    assert facts.seccomp_notify_reason == ""
    assert set(facts.capabilities) == {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}
    if facts.euid == 0:
        assert facts.capabilities["CapEff"] != 0
    # the probes ran in children: this process is still unconfined
    with open("/proc/self/status") as f:
        status = f.read()
    assert "NoNewPrivs:\t0" in status and "Seccomp:\t0" in status


def test_this_machine_has_every_default_layer() -> None:
    """The CI machine (Linux 6.18, Landlock ABI 7) must run `--isolation auto` undegraded."""
    facts = host.probe()
    _need(facts.system == "Linux" and facts.landlock_abi >= 6, f"needs Landlock ABI >= 6, have {facts.landlock_abi}")
    checks = doctor.checks(facts)
    assert not doctor.default_isolation_degraded(checks), [c for c in checks if c.status != "ok"]


def test_checks_are_consistent_with_facts() -> None:
    facts = host.probe()
    checks = doctor.checks(facts)
    by_name = {c.name: c for c in checks}
    assert len(by_name) == len(checks)
    assert set(doctor.DEFAULT_ISOLATION_PARTS) <= set(by_name)
    for c in checks:
        assert c.status in doctor.STATUSES and c.detail and c.needed_for
        assert json.loads(json.dumps(c.to_json()))["name"] == c.name
    assert (by_name["landlock.fs"].status == "missing") == (facts.landlock_abi < 1)
    assert (by_name["landlock.net"].status == "ok") == facts.landlock_net
    assert (by_name["landlock.scope"].status == "ok") == facts.landlock_scope
    assert (by_name["seccomp"].status == "ok") == facts.seccomp
    assert (by_name["seccomp.notify"].status == "ok") == facts.seccomp_notify
    assert (by_name["user_namespaces"].status == "ok") == facts.user_namespaces
    expected = any(by_name[p].status != "ok" for p in doctor.DEFAULT_ISOLATION_PARTS)
    assert doctor.default_isolation_degraded(checks) == expected


def _facts(**kw) -> host.HostFacts:
    base = dict(
        system="Linux", release="6.1.0", machine="x86_64", platform_supported=True, platform_reason="",
        euid=1000, landlock_abi=3, landlock_reason="", landlock_fs_rights=("READ_FILE",),
        landlock_net=False, landlock_scope=False, seccomp=True, seccomp_reason="",
        seccomp_notify=True, seccomp_notify_reason="", capabilities={}, user_namespaces=False,
        user_namespaces_reason="unshare(CLONE_NEWUSER) failed: Operation not permitted",
    )
    base.update(kw)
    return host.HostFacts(**base)


def test_doctor_on_an_older_kernel_degrades() -> None:
    checks = doctor.checks(_facts())
    by_name = {c.name: c for c in checks}
    assert by_name["landlock.fs"].status == "degraded" and "IOCTL_DEV" in by_name["landlock.fs"].detail
    assert by_name["landlock.net"].status == "missing" and "ABI 3 < 4" in by_name["landlock.net"].detail
    assert by_name["landlock.scope"].status == "missing" and "6.12" in by_name["landlock.scope"].detail
    assert by_name["user_namespaces"].status == "missing"
    assert doctor.default_isolation_degraded(checks)
    # user namespaces are optional: without them (and everything else present) auto is whole
    full = _facts(landlock_abi=7, landlock_net=True, landlock_scope=True)
    assert not doctor.default_isolation_degraded(doctor.checks(full))


def test_doctor_on_a_non_linux_host_says_missing() -> None:
    why = "the OS layer needs Linux; this is Darwin"
    facts = _facts(system="Darwin", machine="arm64", platform_supported=False, platform_reason=why,
                   landlock_abi=0, landlock_reason=why, landlock_fs_rights=(), seccomp=False,
                   seccomp_reason=why, seccomp_notify=False, seccomp_notify_reason=why)
    checks = doctor.checks(facts)
    assert {c.name: c.status for c in checks}["platform"] == "missing"
    assert all(c.status == "missing" for c in checks if c.name in doctor.DEFAULT_ISOLATION_PARTS)
    assert doctor.default_isolation_degraded(checks)


def test_doctor_says_when_the_native_responder_is_missing() -> None:
    full = dict(landlock_abi=7, landlock_net=True, landlock_scope=True)
    built = {c.name: c for c in doctor.checks(_facts(native_responder=True, **full))}
    assert built["supervisor.responder"].status == "ok"
    missing = doctor.checks(_facts(native_responder=False, native_responder_reason="not built (x)", **full))
    check = {c.name: c for c in missing}["supervisor.responder"]
    assert check.status == "degraded" and "not built" in check.detail and "same evidence" in check.detail
    assert not doctor.default_isolation_degraded(missing)  # slower, not weaker: doctor still exits 0


def test_this_machine_built_the_native_responder() -> None:
    facts = host.probe()
    if not facts.native_responder and os.environ.get("PIPGUARD_REQUIRE_ALL_LAYERS") != "1":
        pytest.skip(facts.native_responder_reason)
    assert facts.native_responder, facts.native_responder_reason

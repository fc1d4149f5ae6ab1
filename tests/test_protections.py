"""The protection table: one list that plan, oslayer, doctor and report all name from, and
the plan's per-protection states as a real run confirms them."""

import dataclasses

import pytest

from pipguard.cli import doctor_checks as doctor
from pipguard.sandbox import host
from pipguard import protections
from pipguard.sandbox.plan import make_plan
from pipguard.sandbox.rundir import cleanup
from pipguard.sandbox.policy import Policy
from pipguard.protections import ACTIVE, DEGRADED, UNAVAILABLE, ProtectionState


def _facts(**changes):
    return dataclasses.replace(host.probe(), **changes)


def _states(isolation="auto", network="none", facts=None, os_reason=""):
    return {s.name: s for s in protections.planned(isolation, facts or host.probe(), network=network,
                                                    as_root=True, os_reason=os_reason)}


def test_every_name_the_layers_use_is_in_the_table():
    from pipguard.sandbox import run

    report = run(["true"], Policy())
    named = set(report.isolation.applied) | set(report.isolation.unavailable)
    named |= {c.name for c in doctor.checks(host.probe()) if c.name in protections.BY_NAME}
    assert named <= set(protections.BY_NAME), named - set(protections.BY_NAME)
    assert set(doctor.DEFAULT_ISOLATION_PARTS) <= set(protections.BY_NAME)


def test_old_landlock_abi_degrades_and_names_the_kernel():
    states = _states(facts=_facts(landlock_abi=3))
    assert states["landlock.fs"].state == DEGRADED and "IOCTL_DEV" in states["landlock.fs"].reason
    assert states["landlock.net"].state == UNAVAILABLE and "Linux 6.7" in states["landlock.net"].reason
    assert states["landlock.scope"].state == UNAVAILABLE and "Linux 6.12" in states["landlock.scope"].reason
    assert states["seccomp"].state == ACTIVE


def test_no_notification_takes_the_supervisor_with_it():
    states = _states(facts=_facts(seccomp_notify=False, seccomp_notify_reason="kernel says no"))
    assert states["seccomp.notify"] == ProtectionState("seccomp.notify", UNAVAILABLE, "kernel says no")
    assert states["supervisor"].state == UNAVAILABLE


def test_without_the_os_layer_only_audit_and_limits_stay():
    states = _states(os_reason="missing Python package: landlock")
    assert states["audit"].state == ACTIVE
    assert {n for n, s in states.items() if s.state == UNAVAILABLE} >= {"landlock.fs", "seccomp", "supervisor"}
    assert states["seccomp"].reason == "missing Python package: landlock"


def test_levels_choose_their_rows():
    assert set(_states("audit")) == {"audit", "user"}  # as root the audit level runs as a leased uid too
    assert "ns" in _states("ns") and "ns" in _states("auto")  # auto runs in ns where it works
    assert "landlock.net" not in _states(network="all")  # nothing to confine


def test_reconcile_never_claims_more_than_was_applied():
    planned = (ProtectionState("seccomp", ACTIVE), ProtectionState("landlock.fs", ACTIVE),
               ProtectionState("supervisor", ACTIVE))
    got = {s.name: s for s in protections.reconcile(planned, ["seccomp"], {"supervisor": "no listener"})}
    assert got["seccomp"].state == ACTIVE
    assert got["landlock.fs"] == ProtectionState("landlock.fs", UNAVAILABLE, "not applied in this run")
    assert got["supervisor"] == ProtectionState("supervisor", UNAVAILABLE, "no listener")


@pytest.mark.parametrize("isolation", ["auto", "audit"])
def test_a_real_runs_report_matches_what_the_kernel_applied(isolation, tmp_path):
    from pipguard.sandbox import run

    report = run(["true"], Policy(isolation=isolation), cwd=str(tmp_path))
    states = report.isolation.protections
    assert states, "the report lists the protections"
    for name, state in states.items():
        if state["state"] == ACTIVE and name != "cgroup2":
            assert name in report.isolation.applied, name
    for name in report.isolation.applied:
        assert states[name]["state"] in (ACTIVE, DEGRADED), name
    assert report.to_json()["isolation"]["protections"] == states


def test_the_plan_carries_the_runs_settings(tmp_path):
    plan = make_plan(["true"], Policy(timeout=7, max_events=33, limit_processes=99, allow_read=(str(tmp_path),)),
                     cwd=str(tmp_path))
    try:
        s = plan.settings
        assert (s.timeout, s.max_events, s.processes, s.user_read, s.network) == \
            (7, 33, 99, (str(tmp_path),), "none")
        assert s.memory > 0 and s.policy_json["timeout"] == 7
    finally:
        cleanup(plan.run_dir)


@pytest.mark.parametrize("module", ["launcher", "supervisor", "handlers", "lifetime", "keeper", "first_process"])
def test_nothing_after_the_plan_reads_the_policy(module):
    """The one-way flow: launcher and supervisor (its loop, handlers and lifetime) take the
    plan (and its settings), never the Policy: no name Policy, no attribute or variable
    named policy in their code."""
    import ast
    import importlib

    tree = ast.parse(open(importlib.import_module(f"pipguard.sandbox.{module}").__file__).read())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
    assert not names & {"Policy", "policy"}, module


def test_a_split_directory_is_listed_again_once_it_changes(tmp_path, monkeypatch):
    """The plan splits /etc around the system secrets and keeps the split while no listed
    directory changed; here on a tree of our own: kept while nothing changed (not listed
    again), and a file added next to a secret shows up as a grant, the secret staying out."""
    from pipguard.sandbox import plan as planning

    (tmp_path / "ssh").mkdir()
    (tmp_path / "ssh" / "ssh_host_key").write_text("secret")
    (tmp_path / "ssh" / "ssh_config").write_text("ok")
    secret = str(tmp_path / "ssh" / "ssh_host_key")
    first = planning.split_unless_changed(str(tmp_path), [secret])
    assert first == [str(tmp_path / "ssh" / "ssh_config")]
    listings = []
    original = planning.grants_excluding
    monkeypatch.setattr(planning, "grants_excluding", lambda *a: listings.append(a) or original(*a))
    assert planning.split_unless_changed(str(tmp_path), [secret]) == first and listings == []
    (tmp_path / "ssh" / "new_file").write_text("new")
    again = planning.split_unless_changed(str(tmp_path), [secret])
    assert listings  # listed again
    assert sorted(again) == sorted([*first, str(tmp_path / "ssh" / "new_file")]) and secret not in again


def test_the_etc_split_is_what_a_fresh_split_gives():
    from pipguard.sandbox import plan as planning
    from pipguard import rules

    first = planning.etc_entries()
    assert planning.etc_entries() == first == planning.grants_excluding("/etc", rules.ETC_SECRETS)
    assert not set(first) & set(rules.ETC_SECRETS)

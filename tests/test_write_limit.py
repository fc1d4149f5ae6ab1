"""The write limit (``limit_write``, ``RLIMIT_FSIZE``) bounds what a build writes into its tree and
its temp dirs, and a run that hits it says so (issue 33).

Before, the bound held but was reported only when the first process itself died of ``SIGXFSZ``:
a writer reaped by its own parent inside the run (``sh -c 'dd ...'``, make, a build backend's
subprocess) and a Python writer (Python ignores ``SIGXFSZ``: ``write`` fails with ``EFBIG``) hit
it silently. Now the file left at the limit's size is the evidence. A lowered limit (50 MiB)
keeps each run short and the machine's disk untouched; the 1 GiB case with the default limit is
measured in docs/sandbox.md ("Resource limits").
"""

from __future__ import annotations

import os
import sys
import uuid

import pytest

from pg import backend_param, pipguard
from support import requires
from support.pipinstall import pg_install
from support.projects import write_project

pytestmark = [requires("linux"), requires("seccomp_user_notif")]

MIB = 1 << 20
LIMIT = 50 * MIB
WRITERS = {
    # a grandchild of the first process: dies of SIGXFSZ, reaped by the shell
    "native": "dd if=/dev/zero of={path} bs=1M count=80 status=none; echo status=$?",
    # Python (with the audit hook: under ns its own /tmp is writable to it too): SIGXFSZ ignored,
    # the write fails with EFBIG; nobody dies
    "python": sys.executable + " -c \"import sys\ntry:\n with open(sys.argv[1], 'wb') as f:\n"
              "  for _ in range(80): f.write(bytes(1 << 20))\nexcept OSError as e: print('status', e.errno)\" {path}",
}


@pytest.mark.parametrize("where, writer, backend", [
    backend_param("plain", "tree", "native"), backend_param("plain", "tree", "python"),
    backend_param("plain", "tmpdir", "native"),
    backend_param("ns", "tree", "native"), backend_param("ns", "tmpdir", "python"),
    backend_param("ns", "own-tmp", "native"), backend_param("ns", "own-tmp", "python"),
], indirect=["backend"])
def test_write_past_the_limit_is_stopped_and_reported(work, fake_home, where, writer, backend):
    """80 MiB written into one file of the build's tree, of its ``$TMPDIR`` (the run's private
    temp dir, on the host's disk) or of the namespace's own ``/tmp`` (a tmpfs): the file stops
    at the limit, the run reports ``limit-disk`` naming it, and what was in the temp dirs is
    gone after the run."""
    name = f"big-{uuid.uuid4().hex[:8]}"
    path = {"tree": f"./{name}", "tmpdir": f"$TMPDIR/{name}", "own-tmp": f"/tmp/{name}"}[where]
    r = pipguard(["run", "--isolation", backend.isolation, "--limit-write", "50M", "--",
                  "/bin/sh", "-c", WRITERS[writer].format(path=path)], cwd=work, env=fake_home.env())
    assert r.report is not None, r.stderr[-3000:]
    expected = {"native": "status=153", "python": "status 27"}[writer]  # 128 + SIGXFSZ; EFBIG
    assert expected in r.stdout, (r.stdout, r.stderr[-2000:])
    assert r.report["limit_hit"] == "write", r.report["events"]
    (event,) = r.blocked(rule="limit-disk")
    (reported,) = event["detail"]["files"]
    assert reported.endswith("/" + name) and event["detail"]["limit"] == LIMIT, event
    if where == "tree":
        assert (work / name).stat().st_size == LIMIT  # stopped at the limit, left to the user
    else:
        # the run's temp dirs are gone with it: nothing of it stays on the host
        assert not os.path.lexists(reported) and not os.path.lexists(f"/tmp/{name}"), reported
    assert r.report["verdict"] == "blocked"


@pytest.mark.parametrize("backend", [backend_param("plain"), backend_param("ns")], indirect=True)
def test_install_build_writing_past_the_limit_is_reported(tmp_path, fake_home, links, target, backend):
    """A setup.py that writes 80 MiB into its own tree (the user's checkout) under
    ``pipguard install --sandbox --limit-write 50M``: its write fails at the limit, the hook call
    reports ``limit-disk``, and the install is refused."""
    proj = write_project(tmp_path, "bigwriter")
    (proj / "setup.py").write_text(
        "try:\n    with open('blob.bin', 'wb') as f:\n        for _ in range(80):\n"
        "            f.write(bytes(1 << 20))\nexcept OSError:\n    pass\n" + (proj / "setup.py").read_text())
    proc, report = pg_install([*backend.install_args, "--limit-write", "50M", "."], home=fake_home,
                              target=target, route=links, cwd=proj)
    assert report is not None, proc.stderr[-3000:]
    rules = [e["rule"] for e in report["events"] if e["action"] == "blocked"]
    assert "limit-disk" in rules, report["events"]
    assert (proj / "blob.bin").stat().st_size == LIMIT
    assert proc.returncode != 0, proc.stderr[-2000:]

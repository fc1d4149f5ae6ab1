"""The supervisor's native responder (pipguard/_responder.c) against the Python one.

The native thread answers only opens that the Python fast path answers without evidence;
everything else (here: relative and dirfd-relative opens whose base is a home, paths with
"..") must reach the Python supervisor and be blocked AND reported exactly as before. Every
case runs with both responders (``PIPGUARD_PYTHON_RESPONDER=1`` forces the Python one).
"""

from __future__ import annotations

import errno
import os

import pytest

from pg import pipguard
from support import parse_try_one, requires

pytestmark = [requires("linux"), requires("landlock", abi=6), requires("seccomp_user_notif")]


@pytest.fixture(params=["native", "python"])
def responder(request):
    if request.param == "native" and not _native_built():
        if os.environ.get("PIPGUARD_REQUIRE_ALL_LAYERS") == "1":
            pytest.fail("pipguard._responder is not built (pip install -e . compiles it; gcc?)")
        pytest.skip("pipguard._responder is not built")
    return request.param


def _native_built() -> bool:
    try:
        from pipguard import _responder  # noqa: F401
    except ImportError:
        return False
    return True


def _run(responder, argv, *, work, home):
    extra = {"PIPGUARD_PYTHON_RESPONDER": "1"} if responder == "python" else {}
    r = pipguard(["run", "--isolation", "os", "--", *map(str, argv)], cwd=work,
                 env=home.env(extra))
    assert r.report is not None, r.stderr
    assert r.report["supervision"]["responder"] == responder, r.report["supervision"]
    return parse_try_one(r.stdout), r


@pytest.fixture
def work(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.mark.parametrize("action", ["read-from", "read-at"])
def test_relative_secret_read_is_blocked_and_reported(responder, action, try_one_bin, work,
                                                      fake_home):
    secret = fake_home.secrets["id_rsa"]
    # chdir into the home (chdir is not an open), or a dirfd of "/" (opening the
    # home itself would already be refused as a home read)
    base = str(fake_home.path) if action == "read-from" else "/"
    rel = os.path.relpath(secret, base)
    out, r = _run(responder, [try_one_bin, action, base, rel], work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    events = r.blocked(kind="file-read", layer="supervisor")
    assert [e["target"] for e in events] == [str(secret)], r.report["events"]
    assert events[0]["rule"] == "secret-read"
    assert fake_home.markers["id_rsa"] not in r.stdout + r.stderr


def test_dotdot_from_the_build_dir_is_blocked_and_reported(responder, try_one_bin, work, fake_home):
    secret = fake_home.secrets["id_rsa"]
    sneaky = os.path.join(str(work), os.path.relpath(secret, work))  # work/../../...
    assert "/.." in sneaky
    out, r = _run(responder, [try_one_bin, "read", sneaky], work=work, home=fake_home)
    assert not out["ok"] and out["errno"] == errno.EACCES, out
    assert r.targets(kind="file-read", layer="supervisor") == [str(secret)], r.report["events"]


def test_allowed_opens_pass_and_are_answered_by_the_right_responder(responder, try_one_bin, work,
                                                                     fake_home):
    (work / "src.c").write_text("int x;\n")
    for argv in ([try_one_bin, "read", "/usr/include/stdio.h"],
                 [try_one_bin, "read-from", work, "src.c"],
                 [try_one_bin, "read-at", "/usr/include", "stdio.h"]):
        out, r = _run(responder, argv, work=work, home=fake_home)
        assert out["ok"], (argv, out)
        assert not r.blocked(), r.report["events"]
        supervision = r.report["supervision"]
        assert supervision["sync_wake_up"] is True  # Linux >= 6.6 here; the ioctl takes flags by value
        if responder == "native":
            # the loader's and the helper's opens never reached Python
            assert supervision["answered_natively"] >= 3, supervision
        else:
            assert supervision["answered_natively"] == 0, supervision

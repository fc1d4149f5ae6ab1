"""Test support for pipguard: fake homes, loopback sinks, the offline wheelhouse, sdists built
from the corpus, capability gates and the try-one-action helper.

Import as ``from support import ...`` (``tests/conftest.py`` puts ``tests/`` on ``sys.path``).
"""
from .gates import (capabilities, check, describe, need, netns_preexec, requires,
                           requires_gcc, requires_landlock, requires_netns, requires_root,
                           requires_seccomp, requires_userns, strict)
from .corpus import HOSTILE, LEGIT, PACKAGES, PERSIST_MARK, all_projects, attempts, pip_wheel, project
from .env import PIP_NEUTRAL, clean_env
from .fakehome import FakeHome, make_fake_home, marker, remove_fake_home
from .interpreters import python_versions
from .listeners import BuildHost, TcpSink, UdpSink, dns_qnames
from .sdist import build_sdist, project_name_version
from .tryone import compile_try_one, parse as parse_try_one, run_try_one, try_one_py_argv
from .users import NOBODY, run_as_nobody, traversable_by
from .wheelhouse import PINS, WheelhouseUnavailable, ensure_wheelhouse, wheelhouse_dir

__all__ = [
    "BuildHost", "FakeHome", "HOSTILE", "LEGIT", "NOBODY", "traversable_by", "PACKAGES", "PERSIST_MARK", "PINS", "PIP_NEUTRAL",
    "TcpSink", "UdpSink", "WheelhouseUnavailable", "all_projects", "attempts", "build_sdist",
    "capabilities", "check", "clean_env", "compile_try_one", "describe", "dns_qnames",
    "ensure_wheelhouse", "make_fake_home", "marker", "need", "netns_preexec", "parse_try_one",
    "pip_wheel", "project", "project_name_version", "python_versions", "remove_fake_home",
    "requires", "requires_gcc", "requires_landlock", "requires_netns", "requires_root",
    "requires_seccomp", "requires_userns", "run_as_nobody", "run_try_one", "strict",
    "try_one_py_argv", "wheelhouse_dir",
]
from .index import LoopbackIndex  # noqa: E402

__all__ += ["LoopbackIndex"]

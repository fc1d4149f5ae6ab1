"""The import probe (``--probe-imports``, :class:`ImportProbe`): the gated wheels staged with
pip into a throw-away directory, each new top-level module imported in a sandbox of its own;
an attempt the sandbox blocks refuses the install, as a hook call's would.

Imported after pip started (with the installer): the sandbox and the result models are
imported where they are used.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from typing import Dict, List, Sequence

from pipguard.install.session import InstallSession, _hosts, _seen


class ImportProbe(InstallSession):
    """Imports of the gated wheels' modules, sandboxed."""

    def _probe(self, wheels: Sequence[str]) -> bool:
        """Import each new top-level module in the sandbox, from a staged
        copy; True when an import refused the install. A module's attempts
        are its distribution's (approvals of that wheel's artifact apply)."""
        import shutil
        import tempfile

        from pipguard.install.result import Refusal, _counting
        from pipguard.sandbox.api import run

        stage = tempfile.mkdtemp(prefix="pipguard-probe-")
        try:
            target = os.path.join(stage, "site")
            env = {k: v for k, v in self.env.items() if not k.startswith(("PIP_", "PIPGUARD_"))}
            env["PIP_CONFIG_FILE"] = os.devnull
            proc = subprocess.run([self.python, "-m", "pip", "install", "--no-deps", "--no-index",
                                   "--disable-pip-version-check", "--no-compile", "--target", target,
                                   "-q", *wheels], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0:
                self.error = "staging wheels for the import probe failed: " + proc.stdout.strip()[-300:]
                return True
            work = os.path.join(stage, "work")
            os.mkdir(work)
            owners = _module_owners(target)
            for module in _top_level_modules(target):
                from pipguard.sandbox.policy import Policy

                owner = owners.get(module, module)
                policy = Policy(isolation=self.options.isolation, allow_read=(target,),
                                keep_env=self.options.keep_env, observe_reads=self.options.observe_reads,
                                timeout=self.options.build_timeout, vm_accel=self.options.vm_accel)
                code = f"import sys; sys.path.insert(0, {target!r}); import {module}"
                # the stage is read-only to the probe (and thrown away): without this,
                # Python's import system tries to cache bytecode there, a refused write
                probe_env = dict(env, PYTHONDONTWRITEBYTECODE="1")
                report = run([self.python, "-c", code], policy, cwd=work, env=probe_env)
                phase = self._phase("probe", owner, report, self.origins.get(owner))
                counting = _counting(phase)
                gated = self.gated.get(owner)
                version = gated.version if gated else ""
                if counting:
                    self._refuse(Refusal(owner, version, "attempt", "probe",
                                         tuple(f"import {module}: {_seen(e)}" for e in counting),
                                         self.origins.get(owner), _hosts(counting)))
                    if gated:
                        self.gated[owner] = dataclasses.replace(gated, verdict="blocked",
                                                                events=gated.events + counting)
                    return True
                self.progress(f"{owner}: import {module} ok (probe)")
                if phase.accepted and gated:
                    self.gated[owner] = dataclasses.replace(
                        gated, verdict="approved" if gated.verdict == "clean" else gated.verdict,
                        accepted_events=tuple(self.accepted[owner]))
            return False
        finally:
            shutil.rmtree(stage, ignore_errors=True)


def _module_owners(target: str) -> Dict[str, str]:
    """Top-level module -> the (canonical) distribution that ships it, from
    each ``.dist-info/RECORD`` in the staging directory."""
    from packaging.utils import canonicalize_name

    owners: Dict[str, str] = {}
    for entry in os.listdir(target):
        if not entry.endswith(".dist-info"):
            continue
        dist = canonicalize_name(entry[:-len(".dist-info")].rsplit("-", 1)[0])
        try:
            with open(os.path.join(target, entry, "RECORD"), encoding="utf-8") as handle:
                for line in handle:
                    top = line.split(",", 1)[0].split("/", 1)[0]
                    if top.endswith(".py"):
                        top = top[:-3]
                    owners.setdefault(top, dist)
        except OSError:
            continue
    return owners


def _top_level_modules(target: str) -> List[str]:
    out = set()
    for name in os.listdir(target):
        if name.endswith((".dist-info", ".data")) or name == "bin" or name.startswith(("_", ".")):
            continue
        if name.endswith(".py"):
            out.add(name[:-3])
        elif os.path.isdir(os.path.join(target, name)) and name.isidentifier():
            out.add(name)
    return sorted(out)

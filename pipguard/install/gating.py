"""pip's gate requests answered (:class:`WheelGate`, the installer's ``gate`` handler): before
pip installs any wheel, each is scanned (:mod:`pipguard.gate.scan`, findings remembered by
:mod:`pipguard.gate.cache`), checked for files it would overwrite (:meth:`WheelGate._ownership`)
and for requirements by URL (:meth:`WheelGate._url_findings`), its findings and its hook calls'
attempts weighed against the approvals, its imports optionally probed
(:mod:`~pipguard.install.importprobe`); the answer is install, stop or refuse. After pip, a
wheel built here that the gate did not pass is removed from pip's wheel cache
(:meth:`WheelGate._evict_ungated`).

Imported after pip started (with the installer): the gate, packaging and the result models are
imported where they are used.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, List, Tuple

from pipguard.install.importprobe import ImportProbe
from pipguard.install.session import _fingerprint, _problem_findings

if TYPE_CHECKING:
    from pipguard.gate import scan as gate  # imported where it scans: tarfile, zipfile, lzma... (~15 ms a start)


class WheelGate(ImportProbe):
    """The answer to pip's ``gate`` request, and pip's wheel cache kept to what it passed."""

    def _evict_ungated(self) -> None:
        """Remove from pip's wheel cache every wheel a build of this run put there that the
        gate did not pass: a refused wheel (or one pip never got to gate because the install
        stopped) would otherwise be installed by a later plain ``pip install`` without a build
        or a gate. pip moves a built wheel from the hook's output directory into its cache
        (``<cache>/wheels/…``) after the call: it is found there by name and sha256. What the
        gate passed stays, as pip left it (docs/sandbox.md)."""
        doubtful = {built for built in self.built_wheels if built not in self.passed}
        if not doubtful or not self.cache_dirs:
            return
        from pipguard.sandbox.files import walk

        names = {name for name, _, _ in doubtful}
        for cache in sorted(self.cache_dirs):
            for root, _dirs, files in walk(os.path.join(cache, "wheels")):
                for name in names.intersection(files):
                    path = os.path.join(root, name)
                    if os.path.islink(path) or not os.path.isfile(path) or _fingerprint(path) not in doubtful:
                        continue
                    try:
                        os.unlink(path)
                    except OSError as exc:
                        self.progress(f"could not remove {name} from pip's wheel cache: {exc}")
                        continue
                    self.progress(f"{name}: removed from pip's wheel cache (built here, not passed by the gate)")
                    try:  # pip's origin.json beside it describes the wheel: gone with the last one
                        if not any(n.endswith(".whl") for n in os.listdir(root)):
                            os.unlink(os.path.join(root, "origin.json"))
                    except OSError:
                        pass

    def _on_gate(self, request: dict, fds: List[int]) -> dict:
        from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

        from pipguard.gate import cache as gatecache
        from pipguard.install.approvals import Origin
        from pipguard.sandbox.files import sha256
        from pipguard.install.result import REFUSING_SEVERITIES, PackageResult, Refusal

        self.gate_answered = True
        role = request.get("role")
        if self.refusal:
            return {"decision": "refuse", "message": f"pipguard: refused: {self.refusal}"}
        wheels = request.get("wheels") or []
        results: List[PackageResult] = []
        owned = self._ownership(request) if role == "top" else {}
        approvals = self.options.project.approvals
        for wheel in wheels:
            path = wheel.get("path") if isinstance(wheel, dict) else None
            if not isinstance(path, str) or not path.endswith(".whl") or not os.path.isfile(path) \
                    or os.path.islink(path):
                name = wheel.get("name") if isinstance(wheel, dict) else None
                self.error = (f"pip is about to install {name or 'a requirement'} from something that "
                              "is not a wheel file (a legacy install path); pipguard installs wheels only")
                return {"decision": "refuse", "message": "pipguard: " + self.error}
            try:
                dist, version, _build, _tags = parse_wheel_filename(os.path.basename(path))
            except InvalidWheelFilename as exc:
                self.error = f"not a valid wheel file name: {exc}"
                return {"decision": "refuse", "message": "pipguard: " + self.error}
            name = canonicalize_name(dist)
            calls = [r for r in self.hook_results if r.call.package == name]
            # setuptools' editable finder is the expected result of `-e DIR`, and only
            # for the project the user named: pip says which wheel that is
            project = wheel.get("source_dir") if wheel.get("editable") and wheel.get("user_supplied") else None
            try:
                digest = sha256(path)
                findings = gatecache.scan_wheel(path, digest, editable_project=project if isinstance(project, str)
                                                else None, remember=not calls)
            except Exception as exc:  # a corrupt archive is a finding of its own kind: refuse
                self.error = f"{name}: the wheel cannot be read: {exc}"
                return {"decision": "refuse", "message": "pipguard: " + self.error}
            findings += tuple(owned.get(name, ()))
            findings += self._url_findings(name, path, digest, wheel, calls)
            # what its hook calls left that is only reported (files created in the user's project)
            findings += tuple(f for r in calls for f in _problem_findings(r))
            origin = Origin.from_json(wheel.get("origin")) or self.origins.get(name)
            if origin is not None:
                self.origins[name] = origin
            kept, accepted = [], []
            for finding in findings:
                approval = (approvals.finding(origin, finding.rule, finding.member)
                            if finding.severity in REFUSING_SEVERITIES else None)
                if approval is None:
                    kept.append(finding)
                else:
                    accepted.append((finding, approval))
            events = self._counting_events(name)
            refusing = [f for f in kept if f.severity in REFUSING_SEVERITIES]
            verdict = "blocked" if events else ("gate" if refusing else
                                                ("approved" if accepted or self.accepted.get(name)
                                                 else "clean"))
            results.append(PackageResult(name, str(version), os.path.basename(path), digest,
                                         any(r.call.hook.startswith("build_") for r in calls), verdict,
                                         tuple(kept), events, origin, tuple(accepted),
                                         tuple(self.accepted.get(name, ()))))
            if refusing:
                self._refuse(Refusal(name, str(version), "gate", "gate" if role == "top"
                                     else "gate (a build requirement)",
                                     tuple(f"{f.rule} in {f.member or 'the wheel'}: {f.message}"
                                           for f in refusing), origin))
        if role == "top":
            for result in results:
                self.gated[result.name] = result
        if self.refusal:
            return {"decision": "refuse", "message": f"pipguard: refused: {self.refusal}"}
        if role != "top":
            self.passed.update(_fingerprint(w["path"]) for w in wheels if isinstance(w, dict))
            return {"decision": "install"}  # a build environment: gated, and needed by the build
        for result in results:
            note = " (with approved findings)" if result.accepted_findings else ""
            self.progress(f"{result.name} {result.version}: gate passed{note}")
        if self.options.probe_imports and wheels:
            if self._probe([w["path"] for w in wheels]):
                return {"decision": "refuse", "message": f"pipguard: refused: {self.refusal}"}
        self.passed.update(_fingerprint(w["path"]) for w in wheels if isinstance(w, dict))
        from pipguard.install import builtwheels

        for digest, urls in self.declared_urls.items():  # pip holds them in its cache now
            builtwheels.remember(digest, urls)
        self.declared_urls.clear()
        if self.options.sandbox_only:
            return {"decision": "stop"}
        return {"decision": "install"}

    def _url_findings(self, name: str, path: str, digest: str, wheel: dict,
                      calls: list) -> Tuple["gate.Finding", ...]:
        """Requirements by URL in a wheel's own METADATA, which pip fetches unsandboxed (the
        next run, from its cache, for a wheel pip already holds). A wheel built in this run may
        name only the URLs its project declared (:func:`pipguard.install.hookcall.declared_url_requirements`);
        one from pip's wheel cache was built by a run pipguard cannot vouch for (high), unless
        pipguard built it and passed it (:mod:`pipguard.install.builtwheels`: judged as then);
        one downloaded is what its author published, fetched as plain pip would (medium:
        reported)."""
        from pipguard.install import builtwheels
        from pipguard.gate import scan as gate
        from pipguard.gate.coremeta import direct_references, wheel_metadata

        metadata = wheel_metadata(path)
        if metadata is None:
            return ()
        # what its tree declared, read before any hook ran: found through the hook calls that
        # built it (pip names a `-e .` project only once its metadata exists), or pip's name
        built_here = bool(calls)
        declared = set()
        for result in calls:
            declared |= set(result.call.declared_urls)
        for source in self.sources.values():
            if source.name == name:
                declared |= set(source.declared_urls)
        cached = bool(wheel.get("cached"))
        if cached:
            ours = builtwheels.declared(digest)
            if ours is not None:  # built and passed by pipguard: its project's declarations as then
                cached, built_here, declared = False, True, declared | ours
        out = []
        if metadata.unread:  # what pip would fetch cannot be told: refused, never skipped
            out.append(gate.Finding(name, os.path.basename(path), gate.HIGH, "direct-reference", "METADATA",
                                    None, f"{metadata.unread}: requirements by URL cannot be ruled out", ""))
        for dep, url in direct_references(metadata.requires_dist):
            if (dep, url) in declared and not cached:
                if built_here:
                    self.declared_urls.setdefault(digest, set()).add((dep, url))
                continue
            if built_here or cached:
                severity, how = gate.HIGH, ("from pip's wheel cache, built by an earlier run" if cached
                                            else "built here, and its project did not declare it")
            else:
                severity, how = gate.MEDIUM, "as published by its author; pip fetches it as it would without pipguard"
            out.append(gate.Finding(name, os.path.basename(path), severity, "direct-reference", "METADATA",
                                    None, f"Requires-Dist names a URL that pip fetches outside the sandbox ({how})",
                                    f"{dep} @ {url}" if dep else url))
        return tuple(out)

    def _ownership(self, request: dict) -> Dict[str, List["gate.Finding"]]:
        """Findings of wheels that would overwrite files they do not own, by
        package. The layout is pip's own scheme (sent by the seam), or the
        ``--target`` directory the files end up in."""
        from pipguard.gate import scan as gate

        paths = [w["path"] for w in request.get("wheels") or [] if isinstance(w, dict)
                 and isinstance(w.get("path"), str) and os.path.isfile(w["path"])]
        if not paths:
            return {}
        layout = None
        replaces_entries = False
        if isinstance(request.get("target_dir"), str):
            layout = gate.TargetLayout.for_target_dir(request["target_dir"])
            replaces_entries = request.get("target_upgrade") is True
        else:
            schemes = request.get("schemes") or {}
            scheme = next(iter(schemes.values()), None) if isinstance(schemes, dict) else None
            if isinstance(scheme, dict) and all(isinstance(scheme.get(k), str) for k in
                                                ("purelib", "platlib", "scripts", "data", "headers")):
                imported = request.get("import_paths")
                layout = gate.TargetLayout(scheme["purelib"], scheme["platlib"], scheme["scripts"],
                                           scheme["data"], os.path.dirname(scheme["headers"]),
                                           import_paths=tuple(p for p in imported if isinstance(p, str))
                                           if isinstance(imported, list) else ())
        if layout is None:
            layout = gate.target_layout(self.python)
        out: Dict[str, List[gate.Finding]] = {}
        from packaging.utils import canonicalize_name

        for finding in gate.check_ownership([gate.WheelToInstall(p) for p in paths], layout,
                                            replaces_entries=replaces_entries):
            out.setdefault(canonicalize_name(finding.package), []).append(finding)
        return out

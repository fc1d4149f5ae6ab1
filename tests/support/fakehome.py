"""A throw-away HOME with planted FAKE credentials; real secrets are never touched.

Every secret file contains the unique marker ``PIPGUARD-FAKE-SECRET-<name>`` near its start, so a
test can look for that marker in whatever reached a sink, a file or a report.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Mapping, Optional

from .env import clean_env

MARKER_PREFIX = "PIPGUARD-FAKE-SECRET-"
BASHRC_ORIGINAL = "# benign .bashrc planted by the pipguard tests\nexport PS1='$ '\nalias ll='ls -l'\n"


def marker(name: str) -> str:
    return MARKER_PREFIX + name


def _templates() -> Dict[str, tuple]:
    """name -> (relative path, content). Formats are realistic enough for a stealer to parse."""
    m = marker
    return {
        "id_rsa": (".ssh/id_rsa",
                   "-----BEGIN OPENSSH PRIVATE KEY-----\n" + m("id_rsa") +
                   "\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtz\n"
                   "-----END OPENSSH PRIVATE KEY-----\n"),
        "aws": (".aws/credentials",
                "[default]\naws_access_key_id = " + m("aws") +
                "\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYFAKEFAKEFAKE\n"),
        "pypirc": (".pypirc", "[pypi]\nusername = __token__\npassword = " + m("pypirc") + "\n"),
        "npmrc": (".npmrc", "//registry.npmjs.org/:_authToken=" + m("npmrc") + "\n"),
        "docker": (".docker/config.json",
                   '{"auths": {"https://index.docker.io/v1/": {"auth": "' + m("docker") + '"}}}\n'),
        "gh": (".config/gh/hosts.yml",
               "github.com:\n    oauth_token: " + m("gh") + "\n    user: fake\n"),
        "netrc": (".netrc", "machine pypi.org login __token__ password " + m("netrc") + "\n"),
        "git-credentials": (".git-credentials", "https://fake:" + m("git-credentials") + "@github.com\n"),
        "kube": (".kube/config",
                 "apiVersion: v1\nkind: Config\nusers:\n- name: fake\n  user:\n    token: " + m("kube") + "\n"),
        "firefox": (".mozilla/firefox/x.default/logins.json",
                    '{"logins": [{"hostname": "https://example.invalid", "encryptedPassword": "' +
                    m("firefox") + '"}]}\n'),
    }


#: Fake environment variables (CI-token style) offered by ``FakeHome.env(fake_tokens=True)``.
ENV_TOKENS = ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "NPM_TOKEN")


@dataclass
class FakeHome:
    """``path``: the home; ``secrets``: name -> file; ``markers``: name -> marker string.

    ``env_markers``: variable -> marker for the fake tokens ``env(fake_tokens=True)`` sets.
    ``bashrc``: the planted ``.bashrc`` (benign, pre-existing), original text in ``bashrc_original``.
    """

    path: Path
    secrets: Dict[str, Path]
    markers: Dict[str, str]
    env_markers: Dict[str, str] = field(default_factory=dict)
    bashrc_original: str = BASHRC_ORIGINAL

    @property
    def bashrc(self) -> Path:
        return self.path / ".bashrc"

    def env(self, extra: Optional[Mapping[str, str]] = None, fake_tokens: bool = False) -> dict:
        """A clean environment with ``HOME`` here and pip neutralised (see ``support.env``).

        ``fake_tokens=True`` also sets the fake CI tokens in ``env_markers``.
        """
        more = dict(self.env_markers) if fake_tokens else {}
        more.update(extra or {})
        return clean_env(self.path, more)

    def stolen(self) -> Dict[str, bytes]:
        """Files named ``stolen-*`` that corpus packages dropped in the home: name -> content."""
        return {p.name: p.read_bytes() for p in sorted(self.path.glob("stolen-*")) if p.is_file()}

    def leaked(self, data: bytes) -> list:
        """Names of the secrets whose marker occurs in ``data``."""
        return [n for n, mk in self.markers.items() if mk.encode() in data]


def make_fake_home(base: Optional[os.PathLike] = None, owner_uid: Optional[int] = None,
                   owner_gid: Optional[int] = None) -> FakeHome:
    """Create a fake home under ``base`` (default: a fresh 0o755 dir in the system temp dir, which
    an unprivileged user can traverse, unlike pytest's 0o700 ``tmp_path``).

    Directories are 0o755, secret files 0o600 like real ones. ``owner_uid`` (root only) chowns the
    whole tree, so e.g. ``nobody`` (65534) owns its home and can read its own fake secrets.
    """
    if base is None:
        base = tempfile.mkdtemp(prefix="pipguard-home-")
        os.chmod(base, 0o755)
    home = Path(base)
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o755)
    secrets, markers = {}, {}
    for name, (rel, content) in _templates().items():
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(home).parents:
            if str(parent) != ".":
                os.chmod(home / parent, 0o755)
        path.write_text(content)
        os.chmod(path, 0o600)
        secrets[name] = path
        markers[name] = marker(name)
    (home / ".bashrc").write_text(BASHRC_ORIGINAL)
    os.chmod(home / ".bashrc", 0o644)
    fh = FakeHome(path=home, secrets=secrets, markers=markers,
                  env_markers={v: marker("env-" + v) for v in ENV_TOKENS})
    if owner_uid is not None:
        gid = owner_uid if owner_gid is None else owner_gid
        for root, dirs, files in os.walk(home):
            os.chown(root, owner_uid, gid)
            for n in dirs + files:
                os.chown(os.path.join(root, n), owner_uid, gid, follow_symlinks=False)
    return fh


def remove_fake_home(fh: FakeHome) -> None:
    shutil.rmtree(fh.path, ignore_errors=True)

"""The one rule table: which paths are credentials, startup files, configuration
lookups and system secrets, which ``/proc`` entries are private, and which rules
are informational. Every enforcer is built from it:

- the audit hook (``pipguard/sandbox/_hook/_pipguard_hook.py``) receives :func:`hook_table`
  inside its ``PIPGUARD_HOOK`` configuration (it runs in sandboxed Pythons that
  need not have pipguard installed, so it gets data, not this module);
- the Python supervisor decides opens with :func:`read_rule` / :func:`write_rule`;
- the native responder (``pipguard/sandbox/_responder.c``) gets its prefix tables from
  :func:`native_tables` at start-up;
- the plan (Landlock's grants) leaves :data:`ETC_SECRETS` and every home out.

``tests/test_rules.py`` runs one list of cases against all three enforcers.

Standard library only, importable on Python 3.9+, no side effects.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

BLOCKED, ALLOWED = "blocked", "allowed"
FINDING, INFO = "finding", "info"

# System directories a build reads. Home directories are excluded wholesale:
# Landlock cannot subtract a subtree from a grant, so the list is built around them.
SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
               "/opt", "/nix", "/gnu", "/snap", "/sys", "/proc", "/var/lib/dpkg")

# Credential stores, relative to any home (the real ones and the sandbox's decoy):
# reading one is refused and a finding everywhere, also in the decoy home where it
# can only reveal the intent. Writing one is refused outside the decoy home.
CREDENTIAL_PATHS = (
    ".ssh", ".aws", ".azure", ".config/gcloud", ".kube", ".docker/config.json",
    ".pypirc", ".npmrc", ".yarnrc", ".netrc", ".git-credentials", ".config/gh",
    ".config/hub", ".gnupg", ".password-store", ".vault-token", ".terraform.d",
    ".mozilla", ".config/google-chrome", ".config/chromium", ".config/BraveSoftware",
    ".bitcoin", ".ethereum", ".electrum", ".config/Exodus", ".local/share/keyrings",
    ".cargo/credentials", ".cargo/credentials.toml", ".gem/credentials", ".m2/settings.xml",
    ".config/pip", ".pip", ".bash_history", ".zsh_history", ".python_history",
    # what PyPI's stealers take besides (attacked, issue 33/29): more Chromium browsers, chat
    # tokens, Thunderbird's passwords, wallets and keys of other chains, database and
    # storage clients' passwords, FTP sites
    ".config/microsoft-edge", ".config/opera", ".config/vivaldi", ".config/discord",
    ".config/discordcanary", ".config/discordptb", ".config/Slack", ".local/share/TelegramDesktop",
    ".thunderbird", ".config/solana", ".litecoin", ".dogecoin", ".config/atomic", ".config/Ledger Live",
    ".pgpass", ".my.cnf", ".s3cfg", ".boto", ".config/rclone", ".config/filezilla", ".purple", ".oci",
)
# The files a stealer opens in each credential store above that is a directory (the first:
# the one it opens first). The namespace backend plants a decoy at each in every real home,
# so that opening one is a "decoy-read" and not a quiet ENOENT (pipguard.sandbox.backends.ns.decoys).
FIREFOX_PROFILE = "pipguard.default-release"  # named by the decoy profiles.ini
_CHROMIUM_FILES = ("Local State", "Default/Login Data", "Default/Cookies", "Default/Network/Cookies",
                   "Default/Web Data", "Default/Login Data For Account")
CREDENTIAL_STORE_FILES: Dict[str, Tuple[str, ...]] = {
    ".ssh": ("id_rsa", "id_ed25519", "id_ecdsa", "id_dsa", "config"),
    ".aws": ("credentials", "config"),
    ".azure": ("msal_token_cache.json", "accessTokens.json", "azureProfile.json"),
    ".config/gcloud": ("application_default_credentials.json", "credentials.db",
                       "access_tokens.db"),
    ".kube": ("config",),
    ".config/gh": ("hosts.yml", "config.yml"),
    ".gnupg": ("private-keys-v1.d/pipguard.key", "secring.gpg", "pubring.kbx"),
    ".password-store": (".gpg-id",),
    ".terraform.d": ("credentials.tfrc.json",),
    ".mozilla": ("firefox/profiles.ini", "firefox/installs.ini", *(
        f"firefox/{FIREFOX_PROFILE}/{name}" for name in (
            "logins.json", "key4.db", "key3.db", "cookies.sqlite", "cert9.db", "signons.sqlite",
            "formhistory.sqlite", "places.sqlite"))),
    ".config/google-chrome": _CHROMIUM_FILES,
    ".config/chromium": _CHROMIUM_FILES,
    ".config/BraveSoftware": tuple("Brave-Browser/" + name for name in _CHROMIUM_FILES),
    ".bitcoin": ("wallet.dat", "wallets/wallet.dat"),
    ".ethereum": ("keystore/UTC--pipguard",),
    ".electrum": ("wallets/default_wallet", "config"),
    ".config/Exodus": ("exodus.wallet/seed.seco", "exodus.wallet/passphrase.json",
                       "exodus.wallet/info.seco", "exodus.conf.json"),
    ".local/share/keyrings": ("login.keyring", "user.keystore"),
    ".config/pip": ("pip.conf",),
    ".pip": ("pip.conf",),
    ".config/microsoft-edge": _CHROMIUM_FILES,
    ".config/vivaldi": _CHROMIUM_FILES,
    ".config/opera": ("Local State", "Login Data", "Cookies", "Network/Cookies", "Web Data"),
    # Discord's and Slack's tokens: the leveldb a stealer globs for *.ldb and *.log
    **{store: ("Local Storage/leveldb/000005.ldb", "Local Storage/leveldb/000003.log", "Local State")
       for store in (".config/discord", ".config/discordcanary", ".config/discordptb", ".config/Slack")},
    ".local/share/TelegramDesktop": ("tdata/key_datas",),
    ".thunderbird": ("profiles.ini", *(f"{FIREFOX_PROFILE}/{name}" for name in (
        "logins.json", "key4.db", "key3.db", "cert9.db"))),
    ".config/solana": ("id.json",),
    ".litecoin": ("wallet.dat", "wallets/wallet.dat"),
    ".dogecoin": ("wallet.dat",),
    ".config/atomic": ("Local Storage/leveldb/000003.log",),
    ".config/Ledger Live": ("app.json",),
    ".config/rclone": ("rclone.conf",),
    ".config/filezilla": ("recentservers.xml", "sitemanager.xml"),
    ".purple": ("accounts.xml",),
    ".oci": ("config",),
}
# Stores no build tool opens, in any home: browsers, wallets, keyrings. Their files are
# planted in the run's own $HOME too, where $HOME-relative stealers look.
STEALER_ONLY_STORES = (".mozilla", ".config/google-chrome", ".config/chromium",
                       ".config/BraveSoftware", ".bitcoin", ".ethereum", ".electrum",
                       ".config/Exodus", ".local/share/keyrings", ".config/microsoft-edge", ".config/opera",
                       ".config/vivaldi", ".config/discord", ".config/discordcanary", ".config/discordptb",
                       ".config/Slack", ".local/share/TelegramDesktop", ".thunderbird", ".config/solana",
                       ".litecoin", ".dogecoin", ".config/atomic", ".config/Ledger Live")


def credential_files(stores: Sequence[str] = CREDENTIAL_PATHS) -> Tuple[str, ...]:
    """Every file, relative to a home, of ``stores``: a store's usual files
    (:data:`CREDENTIAL_STORE_FILES`), or the path itself for a single file."""
    return tuple(dict.fromkeys(
        store + "/" + name if store in CREDENTIAL_STORE_FILES else store
        for store in stores for name in CREDENTIAL_STORE_FILES.get(store, ("",))))


# Configuration files that build tools look up in ~ (meson: ~/.netrc; git, pip,
# distutils, cargo). In the sandbox's decoy home, which holds nothing of the user,
# a read is a lookup that finds nothing: allowed, informational "config-lookup".
# In a real home the credential and home rules apply as everywhere (a real
# ~/.netrc holds passwords). Names here win over CREDENTIAL_PATHS in the decoy only.
CONFIG_LOOKUPS = (
    ".netrc", ".gitconfig", ".config/git", ".config/pip", ".pip", ".pydistutils.cfg",
    ".cargo/config", ".cargo/config.toml", ".config/meson", ".local/share/meson",
    ".condarc", ".config/matplotlib", ".wgetrc", ".curlrc",
)
# Startup files relative to any home: a write there is a persistence attempt,
# also in the sandbox's own (throw-away) HOME, where it reveals the intent.
PERSISTENCE_PATHS = (
    ".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zprofile", ".zshenv",
    ".zlogin", ".cshrc", ".tcshrc", ".config/fish", ".config/autostart", ".config/systemd",
    ".config/environment.d", ".local/share/systemd", ".xinitrc", ".xprofile", ".pam_environment",
    ".local/lib", ".ssh", ".pythonrc", ".pythonstartup", ".config/pip", ".pip", ".pypirc",
    ".gitconfig", ".config/git", ".npmrc", ".docker",
)
# System secrets: password hashes, sudo rules, host keys, private TLS keys,
# VPN/Wi-Fi/container secrets, Kerberos keys, and pip's site-wide configuration
# (an index URL there often carries a private index's user:password). Landlock
# never grants them (plan.etc_grants); reading one is "secret-read".
ETC_SECRETS = (
    "/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers",
    "/etc/sudoers.d", "/etc/ssh", "/etc/security", "/etc/NetworkManager", "/etc/wireguard",
    "/etc/openvpn", "/etc/ipsec.secrets", "/etc/ppp", "/etc/libvirt", "/etc/docker",
    "/etc/containerd", "/etc/krb5.keytab", "/etc/pki", "/etc/cups", "/etc/polkit-1",
    "/etc/ssl/private", "/etc/pip.conf", "/etc/xdg/pip",
)
# Entries of /proc/<pid>/ (and /proc/<pid>/task/<tid>/) of another process that
# reveal its memory, environment, arguments or files.
PROC_PRIVATE = frozenset((
    "environ", "cmdline", "mem", "maps", "fd", "fdinfo", "map_files", "auxv", "stack",
    "syscall", "smaps", "smaps_rollup", "numa_maps", "pagemap", "root", "cwd", "exe",
    "io", "personality", "wchan", "timers", "mountinfo", "mounts",
))
# Mode bits a build's files never keep: setuid and setgid (as root under ns, a file the sandbox
# writes is root's on the host, where the mount's nosuid does not hold). Refused to chmod, mknod
# and creating opens (seccomp, supervisor), cleared after the run (ns as root, the plain
# backend's uid release) together with world-write.
PRIVILEGED_MODES = 0o4000 | 0o2000
CLEARED_MODES = PRIVILEGED_MODES | 0o0002
# What a build may not add to any file of its write roots, whatever the backend or the user
# pipguard runs as (pipguard.sandbox.filemodes: snapshot before the run, put back after it): the special
# mode bits and the POSIX ACLs, access and default, whatever uid or gid an entry names. An entry
# for another user outlives the run in the user's checkout; a default ACL is inherited by every
# file created there later. What a file had before the run stays, and a new file keeps what the
# kernel gave it from its directory as that was before the run. Each one put back is a finding.
KEPT_MODE_RULES = {0o4000: "privileged-mode", 0o2000: "privileged-mode", 0o1000: "sticky-mode"}
SPECIAL_MODES = sum(KEPT_MODE_RULES)
ACL_RULES = {"system.posix_acl_access": "acl-added", "system.posix_acl_default": "default-acl-added"}
# Rules that are listed but never make the verdict: refusals that ordinary tools
# trigger (urllib3's IPv6 probe binds ::1 port 0; glibc tries nscd's socket on user
# lookups; another Python version caches pipguard's hook) and lookups of
# configuration in the decoy home.
INFO_RULES = frozenset(("loopback-bind", "nscd-probe", "hook-bytecode", "config-lookup",
                        "toolchain-prefix"))

MESSAGES = {
    "proc-other-process": "reading another process's private /proc files",
    "secret-read": "this is a credential location",
    "secret-write": "this is a credential location",
    "home-read": "home directories are not readable in the sandbox",
    "foreign-read": "this belongs to another build (pip's temporary area of this install)",
    "persistence": "startup and configuration files of a home directory are off limits",
    "write-outside-roots": "writes are allowed only in the build dir and the sandbox temp dir",
    "config-lookup": "configuration lookup in the sandbox home (it is empty)",
    "toolchain-prefix": "the prefix of a PATH toolchain in a home, looked into by a build tool's "
                        "search (refused: it is not granted)",
    "unlisted-files": "the run left files in the namespace's own /tmp that could not all be listed "
                      "(too deep, unreadable, too many): what cannot be seen counts as hidden",
    "privileged-mode": "a setuid/setgid bit on a file the build wrote (cleared: on the host it "
                       "would be root's)",
    "sticky-mode": "a sticky bit the build set on a file of its write roots (cleared after the run)",
    "acl-added": "an ACL entry the build set on a file of its write roots (put back as it was "
                 "before the run: an entry naming another user would outlive the run)",
    "default-acl-added": "a default ACL the build set on a directory of its write roots (put back "
                         "as it was before the run: every file created there later would inherit it)",
    "unreadable-arguments": "an open whose path the supervisor could not read (the process made "
                            "itself non-dumpable): refused, as what cannot be seen counts as hidden",
}


def severity(action: str, rule: str) -> str:
    """``finding`` when the event counts toward the verdict (a refusal under a rule
    that is not informational), else ``info``."""
    return FINDING if action == BLOCKED and rule not in INFO_RULES else INFO


@dataclass(frozen=True)
class Grants:
    """The paths of one run the rules are judged against (normalised, no trailing
    slash). ``homes``: every real home; ``sandbox_home``: the decoy ("" for none);
    ``read``/``write``: the allowed roots; ``write_files``: single writable files."""

    homes: Tuple[str, ...]
    sandbox_home: str
    read: Tuple[str, ...]
    write: Tuple[str, ...]
    write_files: FrozenSet[str] = frozenset()
    #: directories holding other tenants' data (pip's temp area: other builds of the same
    #: install): any read below them outside the grants is a finding, ``foreign-read``
    private: Tuple[str, ...] = ()
    #: the prefixes of PATH toolchains in a home (plan.toolchain_prefixes: ``~/.cargo`` for
    #: ``~/.cargo/bin``), not granted: opening or listing exactly one of them is refused
    #: and informational, ``toolchain-prefix``; everything inside keeps its rule
    prefixes: Tuple[str, ...] = ()
    #: write roots that are the namespace's own (its private ``/tmp``, ``/dev/shm``): the
    #: same path on the host is another directory, so no host-side resolution of a path
    #: there means anything (the supervisor resolves those in the sandbox's view)
    namespace_own: Tuple[str, ...] = ()

    @classmethod
    def of(cls, homes: Sequence[str], sandbox_home: str, read: Sequence[str],
           write: Sequence[str], write_files: Sequence[str] = (),
           private: Sequence[str] = (), prefixes: Sequence[str] = (),
           namespace_own: Sequence[str] = ()) -> "Grants":
        return cls(_norm(homes), sandbox_home.rstrip("/"), _norm(read), _norm(write),
                   frozenset(write_files), _norm(private), _norm(prefixes), _norm(namespace_own))


def _norm(paths: Sequence[str]) -> Tuple[str, ...]:
    return tuple(sorted({p.rstrip("/") or "/" for p in paths if p}))


def under(path: str, roots: Sequence[str]) -> bool:
    """``path`` is one of ``roots`` or below one."""
    return any(path == r or path.startswith(r + "/") or r == "/" for r in roots)


def in_homes(path: str, homes: Sequence[str], names: Sequence[str]) -> bool:
    """``path`` is one of ``names`` (or below one) relative to one of ``homes``."""
    for home in homes:
        if home and path.startswith(home + "/"):
            rel = path[len(home) + 1:]
            if any(rel == n or rel.startswith(n + "/") for n in names):
                return True
    return False


def proc_other(path: str, inside: Callable[[int], bool]) -> bool:
    """A private entry of a process for which ``inside(pid)`` is false:
    ``/proc/<pid>/<private>`` or ``/proc/<pid>/task/<tid>/<private>``."""
    parts = path.split("/")
    if not path.startswith("/proc/") or len(parts) < 4 or not parts[2].isdigit():
        return False
    if inside(int(parts[2])):
        return False
    if parts[3] == "task" and len(parts) > 5:
        return parts[5] in PROC_PRIVATE
    return parts[3] in PROC_PRIVATE


def ancestor_of(path: str, roots: Sequence[str]) -> bool:
    """``path`` is a strict ancestor of one of ``roots`` (a directory on the way down to it)."""
    prefix = path.rstrip("/") + "/"
    return any(r.startswith(prefix) and r != path for r in roots)


def etc_secret(path: str) -> bool:
    return under(path, ETC_SECRETS)


def read_rule(path: str, grants: Grants, inside: Callable[[int], bool]) -> Optional[str]:
    """The rule a read of the physical ``path`` breaks, ``"config-lookup"`` (allowed,
    informational), or None (allowed, nothing to say)."""
    if proc_other(path, inside):
        return "proc-other-process"
    sandbox = grants.sandbox_home
    if sandbox and path.startswith(sandbox + "/"):
        rel_home = (sandbox,)
        if in_homes(path, rel_home, CONFIG_LOOKUPS):
            return "config-lookup"
        if in_homes(path, rel_home, CREDENTIAL_PATHS):
            return "secret-read"
    if in_homes(path, grants.homes, CREDENTIAL_PATHS):
        return "secret-read"
    granted = under(path, grants.read + grants.write)
    if etc_secret(path) and not granted:
        return "secret-read"
    if path in grants.prefixes and not granted:
        return "toolchain-prefix"
    if under(path, grants.homes) and not granted:
        return "home-read"
    # The directories above a granted root (pip's temp area, /tmp) are walked up by SCM
    # discovery, git and setuptools, which list each looking for a .git or *.egg-info:
    # that shows the names of the other builds, not what they hold (anything below a
    # name that leads to no grant is still foreign)
    if under(path, grants.private) and not granted and not ancestor_of(path, grants.read
                                                                       + grants.write):
        return "foreign-read"
    return None


def write_rule(path: str, grants: Grants, inside: Callable[[int], bool]) -> Optional[str]:
    """The rule a write to the physical ``path`` breaks, or None."""
    homes = grants.homes + ((grants.sandbox_home,) if grants.sandbox_home else ())
    if proc_other(path, inside):
        return "proc-other-process"
    if in_homes(path, homes, PERSISTENCE_PATHS):
        return "persistence"
    if path in grants.write_files or under(path, grants.write):
        sandboxed = bool(grants.sandbox_home) and path.startswith(grants.sandbox_home + "/")
        credential = in_homes(path, grants.homes, CREDENTIAL_PATHS) or (
            etc_secret(path) and not under(path, grants.read + grants.write))
        return "secret-write" if credential and not sandboxed else None
    if path.startswith(("pipe:", "socket:", "anon_inode:", "/dev/pts/")) or path in (
            "/dev/null", "/dev/tty", "/dev/zero", "/dev/full", "/dev/stdout", "/dev/stderr"):
        return None
    return "write-outside-roots"


def hook_table() -> Dict[str, Any]:
    """The table as the audit hook receives it (JSON in ``PIPGUARD_HOOK``)."""
    return {
        "credentials": list(CREDENTIAL_PATHS), "config": list(CONFIG_LOOKUPS),
        "persistence": list(PERSISTENCE_PATHS), "etc_secrets": list(ETC_SECRETS),
        "proc_private": sorted(PROC_PRIVATE), "messages": dict(MESSAGES),
    }


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/") or a == "/" or b == "/"


def native_tables(grants: Grants, system_read: Sequence[str]) -> Dict[str, List[str]]:
    """Prefix tables of the native responder. It answers CONTINUE only for an
    open under ``read_fast``/``write_fast`` (or ``fixed_fast``, without
    resolving) that is under no ``never_fast`` prefix; everything else goes to
    the Python supervisor, which applies :func:`read_rule`/:func:`write_rule`.
    So ``never_fast`` must cover every path those rules could refuse or report
    inside a fast root: the decoy home, ``/proc/``, the system secrets, and in
    each home that overlaps a fast root its credential and startup entries (the
    whole home when it lies under one, as ``/opt/ci`` under ``/opt``). Writes below
    the namespace's own roots are never fast (see :attr:`Grants.namespace_own`)."""
    sandbox = grants.sandbox_home
    sandbox_roots = tuple(r for r in grants.write if r != sandbox)
    # not the namespace's own roots: the responder resolves in the host's view, where
    # /tmp/X is the host's (a sibling's tree, say), not what the sandbox would write
    write_fast = [r + "/" for r in sandbox_roots if r not in grants.namespace_own]
    read_roots = tuple(dict.fromkeys((*system_read, "/etc", *grants.read, *sandbox_roots)))
    read_fast = [r.rstrip("/") + "/" for r in read_roots if r not in ("/proc", "/sys")]
    # Reads under these may skip realpath: the sandbox cannot plant symlinks
    # there (not writable, nor inside anything writable).
    fixed_fast = [r for r in read_fast if not any(r.startswith(w + "/") for w in grants.write)]
    never = [sandbox + "/"] if sandbox else []
    never += ["/proc/", *ETC_SECRETS]
    fast_roots = [r.rstrip("/") or "/" for r in read_fast + write_fast]
    for home in grants.homes:
        if any(home.startswith(r + "/") or r == "/" for r in fast_roots):
            never.append(home + "/")
        else:  # a fast root at or inside this home (a toolchain, --allow-write ~)
            # only the roots that touch this home can overlap an entry of it (the
            # others would make the loop below ~5,000 comparisons a plan)
            touching = [r for r in fast_roots if _overlaps(home, r)]
            never += [home + "/" + n for n in dict.fromkeys(CREDENTIAL_PATHS + PERSISTENCE_PATHS)
                      if any(_overlaps(home + "/" + n, r) for r in touching)]
    return {"fixed_fast": fixed_fast, "read_fast": read_fast, "write_fast": write_fast,
            "never_fast": list(dict.fromkeys(never))}

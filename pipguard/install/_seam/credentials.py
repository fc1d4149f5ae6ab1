"""Credentials in pip's command line (stdlib only, Python 3.9+): every index, find-links and
proxy URL with a user part (``https://user:token@host/``) moved from the command line, which
any local process may read in ``/proc/PID/cmdline``, into pip's environment variables, which
only processes that may ptrace pip can read (:func:`move_credentials`), in every spelling
optparse accepts and with pip's precedence kept; and the user part of every URL shown as
``***`` where a command line is reported (:func:`redact_credentials`).

Used on both sides of the seam: by pipguard when it starts pip, and by :mod:`target` inside
pip when pip starts a pip subprocess with the index URLs on its command line.
"""

import re

#: pip options whose value may carry credentials (``https://user:token@host/...``), and the
#: environment variable pip reads the same setting from (space-separated when repeated)
_CREDENTIAL_OPTIONS = {"-i": "PIP_INDEX_URL", "--index-url": "PIP_INDEX_URL",
                       "--extra-index-url": "PIP_EXTRA_INDEX_URL", "-f": "PIP_FIND_LINKS",
                       "--find-links": "PIP_FIND_LINKS", "--proxy": "PIP_PROXY"}
#: the shortest abbreviation of each long option that no other option of ``pip install``
#: shares, in pip 23.2 and 26.3 alike (optparse accepts any unique prefix: ``--ext=URL`` is
#: ``--extra-index-url=URL``); ``--isolated`` included (see :func:`isolated`)
_SHORTEST_PREFIX = {"--index-url": "--in", "--extra-index-url": "--ext",
                    "--find-links": "--fi", "--proxy": "--prox", "--isolated": "--is"}
#: pip's short options that take no value, which optparse lets a cluster carry before
#: ``-i``/``-f`` (``-qi URL``); any other letter ends the look into a cluster
_SHORT_FLAGS = frozenset("qvUIh")
#: store options (the last one wins); the others append
_STORE_VARIABLES = ("PIP_INDEX_URL", "PIP_PROXY")


def _long_option(key):
    """The option of :data:`_SHORTEST_PREFIX` that ``key`` spells (exactly or abbreviated), else None."""
    for full, shortest in _SHORTEST_PREFIX.items():
        if key.startswith(shortest) and full.startswith(key):
            return full
    return None


def _credential_option(key):
    """The credential option ``key`` spells (exactly or abbreviated), else None."""
    full = key if key in _CREDENTIAL_OPTIONS else _long_option(key)
    return full if full in _CREDENTIAL_OPTIONS else None


def isolated(args):
    """Does this pip command line ask for ``--isolated`` (pip then ignores every ``PIP_*``
    variable, so credentials moved into them would be lost, and another index used)?"""
    for arg in args:
        if arg == "--":
            return False
        if arg.startswith("--") and _long_option(arg.partition("=")[0]) == "--isolated":
            return True
    return False


def _cluster(args, i):
    """A cluster of short options ending in ``-i``/``-f`` (``-qi URL``, ``-qiURL``): (its
    flags as one argument or None, the option, its value, arguments used); else None."""
    arg = args[i]
    if len(arg) < 3 or arg.startswith("--") or not arg.startswith("-"):
        return None
    for at, letter in enumerate(arg[1:], start=1):
        if letter in "if" and at > 1:
            flags = arg[:at]
            if at + 1 < len(arg):
                return flags, "-" + letter, arg[at + 1:], 1
            if i + 1 < len(args):
                return flags, "-" + letter, args[i + 1], 2
            return None
        if letter not in _SHORT_FLAGS:
            return None
    return None


def _has_user_part(value):
    return "@" in value.split("/", 3)[2 if "://" in value else 0]


def move_credentials(args, env):
    """(args, env) with every index/find-links/proxy URL that has a user part moved from the
    command line (world-readable in /proc/PID/cmdline) into pip's environment variables
    (readable only by processes that may ptrace pip: a Landlock-confined sandbox may not).
    Every spelling optparse accepts: ``-i URL``, ``-iURL``, ``--index-url[=]URL``, and
    unique abbreviations (``--extra=URL``). pip's precedence is kept: of a store option
    (``--index-url``, ``--proxy``) the command line's last value wins over the environment,
    so once one of its values moves, all of them leave the command line and the last one
    is the variable (``-i PLAIN -i https://u:t@h/`` is the credentialed index, as in pip)."""
    args, env = list(args), dict(env)
    # (option's variable or None, value or None, the arguments that spell it)
    parsed, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            parsed.append((None, None, args[i:]))
            break
        name, value, step = None, None, 1
        cluster = _cluster(args, i)
        if cluster is not None:
            flags, name, value, step = cluster  # the flags stay where they are, whatever moves
            parsed.append((None, None, [flags]))
            parsed.append((_CREDENTIAL_OPTIONS[name], value, [name, value]))
            i += step
            continue
        if arg.startswith("--"):
            key, eq, rest = arg.partition("=")
            name = _credential_option(key)
            if name and eq:
                value = rest
            elif name and i + 1 < len(args):
                value, step = args[i + 1], 2
        elif arg[:2] in ("-i", "-f"):
            name = arg[:2]
            if len(arg) > 2:
                value = arg[2:]
            elif i + 1 < len(args):
                value, step = args[i + 1], 2
        variable = _CREDENTIAL_OPTIONS[name] if name and value is not None else None
        parsed.append((variable, value, args[i:i + step]))
        i += step
    moving = {variable for variable, value, _ in parsed if variable and _has_user_part(value)}
    out, moved = [], {}
    for variable, value, spelled in parsed:
        if variable in moving and (variable in _STORE_VARIABLES or _has_user_part(value)):
            moved.setdefault(variable, []).append(value)
        else:
            out += spelled
    for variable, values in moved.items():
        if variable in _STORE_VARIABLES:
            env[variable] = values[-1]  # a store option: the command line's last one wins
        else:  # append options: pip adds the command line's values to the environment's
            env[variable] = " ".join(([env[variable]] if env.get(variable) else []) + values)
    return out, env


_USER_PART = re.compile(r"(://)[^/@\s]+@")


def redact_credentials(args):
    """``args`` with the user part of every URL in them (``https://user:token@host``) shown
    as ``***``: for the report and messages, which CI uploads (the command line is pip's)."""
    return [_USER_PART.sub(r"\1***@", a) if isinstance(a, str) else a for a in args]

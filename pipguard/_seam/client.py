"""The client of one PEP 517 hook call (stdlib C modules only, Python 3.9+).

pip's seam (:mod:`target`) starts ``python -I -S client.py PYTHON
_in_process.py HOOK CONTROL_DIR`` where pip would start the hook. This hands
the call -- argv, cwd, environment and its stdin/stdout/stderr (SCM_RIGHTS) --
to the pipguard process over the private channel named by ``PIPGUARD_SEAM``;
pipguard runs it in a sandbox of its own and answers with the sandboxed
call's status, which this process exits with.

Why a file of its own, importing only built-in C modules (``_socket``,
``_json``): it starts once per hook call, and every millisecond of its
start-up is added to every build. ``-I -S`` skips site; the ``json`` and
``socket`` packages would add ~25 ms of imports (``re``, ``enum``), and
compiling ``target.py`` (it is never cached when run as a script) ~20 ms more.
The protocol is the one :mod:`pipguard.seam` speaks: one JSON line each way.
"""

import _json
import _socket
import os
import sys

SEAM_VARIABLE = "PIPGUARD_SEAM"


class _Decoding:
    """What ``_json.make_scanner`` reads from a decoder (json.JSONDecoder's defaults)."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__
    memo: dict = {}


def _string(text):
    return _json.encode_basestring_ascii(text)


def _request(argv, cwd, env, token):
    """The JSON line of a hook request (what json.dumps would write)."""
    return ('{"type": "hook", "argv": [' + ", ".join(_string(a) for a in argv) + '], "cwd": '
            + _string(cwd) + ', "env": {'
            + ", ".join(_string(k) + ": " + _string(v) for k, v in env.items())
            + '}, "token": ' + _string(token) + "}\n").encode("ascii")


def ask(line, fds):
    """Send one request line with ``fds`` attached; return pipguard's answer (a dict)."""
    path, _, _token = os.environ.get(SEAM_VARIABLE, "").partition(" ")
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
        rights = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
        sock.sendmsg([line[:1]], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        sock.sendall(line[1:])
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    finally:
        sock.close()
    if not answer:
        raise ValueError("pipguard closed the channel without an answer")
    value, _end = _json.make_scanner(_Decoding())(answer.decode("utf-8").strip(), 0)
    if not isinstance(value, dict):
        raise ValueError("pipguard's answer is not an object")
    return value


def main(argv):
    path, _, token = os.environ.get(SEAM_VARIABLE, "").partition(" ")
    if not path or not token:
        sys.stderr.write("pipguard: the hook call could not be handed to the sandbox: "
                         "pipguard's channel is not set (this file is started by pipguard only)\n")
        return 1
    try:
        answer = ask(_request(argv, os.getcwd(), dict(os.environ), token), (0, 1, 2))
    except (OSError, ValueError, StopIteration) as exc:  # StopIteration: the scanner found no value
        sys.stderr.write(f"pipguard: the hook call could not be handed to the sandbox: {exc}\n")
        return 1
    message = answer.get("message") or answer.get("error")
    if message:
        sys.stderr.write(str(message).rstrip("\n") + "\n")
    try:
        return int(answer.get("exit", 1))
    except (TypeError, ValueError):
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

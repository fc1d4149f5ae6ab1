# Clean test-corpus package with a C extension. See README.md.
from setuptools import Extension, setup

setup(
    name="legit_cext",
    version="0.1.0",
    packages=["legit_cext"],
    ext_modules=[Extension("legit_cext._fast", ["src/fast.c"])],
)

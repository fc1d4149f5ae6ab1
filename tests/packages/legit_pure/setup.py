# Clean test-corpus package. See README.md.
from setuptools import setup

setup(
    name="legit_pure",
    version="0.1.0",
    packages=["legit_pure"],
    entry_points={"console_scripts": ["legit-pure = legit_pure:main"]},
)

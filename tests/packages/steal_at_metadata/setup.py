# Clean on purpose: the attack lives in backend.py (PEP 517 hooks). See README.md.
from setuptools import setup

setup(name="steal_at_metadata", version="0.1.0", packages=["steal_at_metadata"], py_modules=[])

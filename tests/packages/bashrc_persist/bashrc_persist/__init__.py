"""Hostile pipguard test-corpus package bashrc_persist (payload runs at build time)."""

"""Hostile pipguard test-corpus package native_helper (payload runs at build time)."""

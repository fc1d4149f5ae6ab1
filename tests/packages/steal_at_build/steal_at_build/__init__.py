"""Hostile pipguard test-corpus package steal_at_build (payload runs at build time)."""

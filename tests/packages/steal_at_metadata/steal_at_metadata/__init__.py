"""Hostile pipguard test-corpus package steal_at_metadata (payload runs at build time)."""

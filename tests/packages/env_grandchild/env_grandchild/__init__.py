"""Hostile pipguard test-corpus package env_grandchild (payload runs at build time)."""

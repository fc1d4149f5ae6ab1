"""Hostile pipguard test-corpus package dns_exfil (payload runs at build time)."""

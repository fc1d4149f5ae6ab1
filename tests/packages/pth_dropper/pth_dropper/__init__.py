"""Hostile pipguard test-corpus package pth_dropper (payload runs at build time)."""

"""Clean pipguard test-corpus package with a C extension."""
from ._fast import add

__all__ = ["add"]

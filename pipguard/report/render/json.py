"""The report as JSON: exactly ``Report.to_json()`` (schema ``pipguard.report/1``).

This is the same text ``--report FILE`` writes, so a consumer can read either.
"""

from __future__ import annotations

from pipguard.report.model import Report, dumps


def render(report: Report, *, color: bool = False) -> str:
    """``color`` is accepted for a uniform signature and ignored: JSON is for machines."""
    del color
    return dumps(report.to_json())

"""The report of a sandboxed run and how it is shown.

``model`` is the frozen ``Report`` (schema ``pipguard.report/1``) and its JSON; ``render/``
holds the pure renderers (table, JSON, SARIF, Markdown, the install and pkgbuild views) and
``render/safe.py``, the one rule of what text may reach a terminal. May import pipguard's
base (``errors``, ``exitcodes``) and ``rules``; never the sandbox, the gate, install or the
CLI: the sandbox builds a Report, the report runs nothing.
"""

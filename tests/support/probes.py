"""Text of the small probe scripts the tests run inside a sandbox."""
from __future__ import annotations

import textwrap

#: ``attempt(what, fn)``: runs ``fn`` and prints ``WHAT ok`` or ``WHAT failed EXCEPTION-NAME``
#: (a probe's lines, each asserted by the test); prepend it to the probe's own code
ATTEMPT = textwrap.dedent("""\
    def attempt(what, fn):
        try:
            fn()
            print(what, "ok")
        except Exception as exc:
            print(what, "failed", type(exc).__name__)
    """)

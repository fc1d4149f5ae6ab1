"""Exit statuses, in one place (DESIGN.md "CLI contract").

``run`` returns the sandboxed command's own status, shell-style. ``install``
and ``sandbox`` use the three codes below: a finding is not an error.
"""

OK = 0
#: Something was blocked, or a gate fired: the install was refused.
REFUSED = 1
#: Could not do the job: bad input, pip failed, a required layer is missing.
ERROR = 2
#: ``run``: the command exceeded ``--timeout`` (as timeout(1) does).
TIMEOUT = 124
#: Stopped by SIGINT to pipguard (the report is still written); SIGTERM: 128+15 = 143 (cli).
INTERRUPTED = 130
#: ``run``: the command could not be started (as a shell does).
NOT_EXECUTABLE = 126
NOT_FOUND = 127


def from_wait_status(exit_code: "int | None", timed_out: bool) -> int:
    """Map a report's ``exit_code`` (negative = killed by signal) to a shell status."""
    if timed_out:
        return TIMEOUT
    if exit_code is None:
        return ERROR
    if exit_code < 0:
        return 128 + (-exit_code)
    return exit_code

"""``python …/pipguard/_seam ARGS``: :mod:`target`'s ``main`` (stdlib only, any
CPython >= 3.9). A script given by its file is compiled on every start, and
target.py took ~3 ms of that in pip and again in each pip subprocess pip
starts; a module imported from this directory comes from its cached bytecode.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if not sys.path or sys.path[0] != _here:  # (it is: the directory run is sys.path[0])
    sys.path.insert(0, _here)
import target  # noqa: E402

# a module named "target" could be anyone's: pip's process keeps ours under a name of its own
# (target.py loads credentials.py by path, under its own name already)
sys.modules["_pipguard_seam_target"] = sys.modules.pop("target")
sys.exit(target.main(sys.argv[1:]))

"""The static gate: what a wheel or sdist holds, judged before pip installs any of it.

``scan`` holds the archive rules, ``findings`` the ``Finding`` and its severities (shared by
the rules and ``ownership``: what an install would overwrite), ``pthshapes`` the known
``.pth`` start-up hooks, ``namespaces`` namespace packages as an install leaves them (nspkg
lines, shim ``__init__``, regular packages), ``wheelpaths`` where pip writes each member, ``coremeta`` core
metadata as pip reads it, ``cache`` findings remembered by content; and what a hook call may
not change in the tree it builds: ``srcguard`` (version-control state, the files pipguard
reads; the check after each call), ``projecttree`` (the user's project tree: files run later,
start-up files, everything else by its stat), ``treefiles`` (entries read without following
links) and ``declared`` (what the project declares itself to be). Pure and bounded: no code from an artifact
runs. May import the base, ``rules`` and ``sandbox.files`` (the one walk of a tree); never
``install`` or ``cli``.
"""

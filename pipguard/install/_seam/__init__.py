"""What runs inside the target interpreter's pip: ``target`` (the seam: hook calls handed to
pipguard, the gate asked before pip installs) and ``credentials`` (URLs with credentials kept
off pip's command line). Stdlib only, any CPython >= 3.9: started by path
(``python …/pipguard/install/_seam``, see ``__main__.py``) in a Python that may not have
pipguard installed; pipguard itself imports ``credentials`` from here. Imports no pipguard.
"""

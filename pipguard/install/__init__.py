"""``pipguard install`` / ``pipguard sandbox``: the real pip with every PEP 517 hook call sandboxed.

``installer`` runs pip with the seam and answers its requests; ``seam`` is the private
channel to pip's process (``_seam/`` is what runs inside pip: stdlib only, loaded by path);
``hookcall`` makes one hook call's policy and checks its result; ``buildoutput`` carries a
call's output to pip; ``result`` is the install's result model; ``approvals`` and
``policyfile`` are what the user accepted and configured. May import the gate, the sandbox,
the report and the base; never ``cli``.
"""

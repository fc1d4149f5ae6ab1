"""The VM backend: the whole sandbox pipeline run inside a QEMU guest.

``runner`` is the host side (the guest's kernel, initramfs and QEMU, the plan's paths shared
into it, the report read back), ``guest`` what runs in the guest (:func:`pipguard.sandbox.run`
there), ``relay`` the virtio-serial framing both sides use (and the index proxy's connections
over it). At the sandbox's layer: it takes the plan, files and proxy beside the API, and the
API takes it; it never imports ``install``, ``gate`` or ``cli``.
"""

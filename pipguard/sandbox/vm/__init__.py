"""The VM backend (``--isolation vm``): the command runs in a QEMU guest.

What the host builds for one run, and why each part is this way:

- **No disk image.** A distribution kernel (``/boot/vmlinuz-*``, with its
  modules in ``/lib/modules/RELEASE``) and an initramfs generated here: a
  static busybox, the few modules the guest needs (virtio PCI, 9p, virtio
  console, resolved from ``modules.dep``) and an init script. It is cached
  (:func:`~pipguard.sandbox.vm.tools.cache_dir`), keyed by everything it is made from.
- **The host's directories over virtio-9p** (QEMU's own server; this
  distribution has no virtiofsd), each at its own path in the guest: what the
  plan grants to read (system directories, the interpreter, pipguard itself,
  ``--allow-read``) shared read-only (``readonly=on`` on the host side, ``ro``
  in the guest), the build directory and ``--allow-write`` read-write. The
  home directories are not shared at all, and ``/etc`` is a copy of the
  entries the plan grants, made per run (a guest that owns its kernel can read
  every share, so a secret must not be in one: the host's ``/etc/shadow`` is
  not in the guest).
- **Read-write shares use ``security_model=mapped-xattr``**: ownership, mode
  bits and special files the guest sets are kept in ``user.virtfs.*`` extended
  attributes on the host, never applied during the run. A guest root can
  therefore not plant a setuid-root file or a device node in the build
  directory. After the run (:func:`~pipguard.sandbox.vm.shares.settle_mapped`) the guest's permission
  bits of regular files and directories are applied (as root without
  setuid/setgid/world-write, as the plain backend's sandbox-user cleanup
  leaves them), symlinks and special files stay the regular files QEMU made,
  and the ``user.virtfs.*`` attributes are removed: the next VM reads the tree
  through a read-only share (model ``none``: host symlinks must stay
  readable, which the mapped models cannot do), where they would be plain
  attributes that ``shutil.copy2`` copies into a mapped share, which QEMU
  refuses (pip's metadata directory between two hook calls).
- **Inside**, the guest's init mounts the shares and runs
  :mod:`pipguard.sandbox.vm.guest`, i.e. :func:`pipguard.sandbox.run` with
  ``isolation="auto"``: the audit hook, Landlock as far as the guest kernel
  has it (Debian 12's 6.1: ABI 2), seccomp, the supervisor. Its report comes
  back on a virtio-serial port of its own; the command's stdout and stderr on
  two more ports, straight to this process's stdout and stderr; the guest
  kernel's console to a file whose tail goes into the report.
- **No network device** (``-nic none``), ever. A plan with build hosts
  (``allow_hosts``) gets one more virtio-serial port, ``net``, whose only
  far end is the host's filtering proxy (:mod:`pipguard.sandbox.proxy`, started here
  for the run): the guest's pipguard relays its sandbox's proxy connections
  over it (:mod:`pipguard.sandbox.vm.relay`, which says why this is not
  user-mode networking with a ``guestfwd``). The host's proxy decides every
  destination, and its records are merged into the report as under ``run``.
  Full network (``allow_network``) is refused under vm.
- **Acceleration**: KVM where a probe boot shows it works (cached per host
  boot); TCG (software emulation, slow) only when asked (``vm_accel="tcg"``).
- **QEMU itself** runs with its seccomp sandbox on (``-sandbox on``: no
  spawning, no privilege changes), so an escape from the guest into QEMU
  lands in a process that cannot start programs.

The host decides the exit status, the timeout (the whole VM, boot included,
is killed) and what was written to the read-write shares (hashed on the host);
the events come from inside the guest. A guest whose kernel was taken over
could forge its events: what the VM guarantees is the containment, not the
evidence. A guest that stops without a complete report (a kernel panic, its
init exiting) gives a report with ``error`` set and the console's tail.

The modules, lowest first (none imports a later one):

- ``tools`` — what a boot needs, found on this host (QEMU, a kernel and its modules in load
  order, a static busybox: :class:`~pipguard.sandbox.vm.tools.Tools`), the guest's init script
  and the cached initramfs;
- ``shares`` — the host's directories in the guest (``Share``), the staged ``/etc``, the
  host's system layout, and what the guest left in a read-write share settled;
- ``qemu`` — QEMU's command line, the console's tail, whether KVM works here
  (``kvm_status``: the probe boot) and the backend's ``probe``;
- ``relay`` — the virtio-serial framing both sides use, and the index proxy's connections over it;
- ``runner`` — one run on the host (``run``, ``preflight``): the plan, the guest's
  configuration, the boot, the report read back and the host proxy's records merged;
- ``guest`` — what runs in the guest (:func:`pipguard.sandbox.run` there).

At the sandbox's layer: it takes the plan, files and proxy beside the API, and the API takes it;
it never imports ``install``, ``gate`` or ``cli``. This package imports nothing: the guest
imports ``guest``, the host ``runner`` (``doctor``: ``qemu.probe``).
"""

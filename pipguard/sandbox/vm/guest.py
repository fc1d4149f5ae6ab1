"""The guest side of the VM backend (:mod:`pipguard.sandbox.vm`; its host side: ``runner``).

The guest's init (a busybox shell script in the initramfs) runs
``python -m pipguard.sandbox.vm.guest CONFIG PORT`` as guest root, after it
mounted the host's shares; this switches to the host user's uid first when
that is not root (as on the host, pipguard then runs unprivileged). This runs the command exactly as ``pipguard run``
would inside the guest (audit hook, Landlock as far as the guest kernel has it,
seccomp, the supervisor: :func:`pipguard.sandbox.run`) and writes the report,
as JSON followed by :data:`END`, to the virtio-serial port ``PORT``: a channel
of its own, never the command's stdout or stderr.

With build hosts (``config["net_device"]``) the sandbox's proxy is a
:class:`~pipguard.sandbox.vm.relay.GuestRelay` on that virtio-serial port
instead of a proxy of its own: the guest has no route to any host, and the
host's proxy decides and records every destination. It stands in for
:class:`pipguard.sandbox.proxy.IndexProxy` here, in this process only (the guest's
pipguard is started for this one run), so that the guest runs exactly the
code ``run`` runs on a host, supervisor-connected proxy sockets included.

A failure of pipguard itself in the guest (the command is missing there, a
required layer is absent) is sent as ``{"guest_error": message, "hint": ...}``.
"""

from __future__ import annotations

import json
import sys

from pipguard.sandbox.vm.relay import END


def _send(port: str, data: dict) -> None:
    payload = json.dumps(data, separators=(",", ":"), default=str).encode() + END
    with open(port, "wb", buffering=0) as fh:
        view = memoryview(payload)
        while view:
            view = view[fh.write(view):]


def main(argv) -> int:
    config_path, port = argv[1], argv[2]
    with open(config_path, encoding="utf-8") as fh:
        config = json.load(fh)
    from pipguard.sandbox import sandbox_user
    from pipguard.errors import PipguardError
    from pipguard.sandbox.policy import Policy
    from pipguard.sandbox.api import run

    # the guest's root holds nothing of the host's: the VM is the boundary here
    sandbox_user.IN_VM_GUEST = True
    uid, gid = int(config.get("uid", 0)), int(config.get("gid", 0))
    if uid != 0:
        # the host user's uid, as on the host: the shares show the host's owners (a
        # build dir of nobody's is nobody's), and the guest's root, without its
        # capabilities in the sandbox, could not write there; switched as pkgbuild's
        # worker is (the dumpable flag back on: the supervisor takes its child's listener)
        from pipguard.sandbox.sandbox_user import switch_to

        switch_to(uid, gid)
    relays = []
    if config.get("net_device"):
        from pipguard.sandbox import proxy
        from pipguard.sandbox.vm.relay import GuestRelay

        def relay(*args, **kwargs) -> GuestRelay:
            made = GuestRelay(config["net_device"], *args, **kwargs)
            relays.append(made)
            return made

        proxy.IndexProxy = relay  # type: ignore[assignment,misc]

    try:
        report = run(config["argv"], Policy.from_mapping(config["policy"]), cwd=config["cwd"],
                     env=config["env"], record_build_dir=False)
    except PipguardError as exc:
        _send(port, {"guest_error": exc.message, "hint": exc.hint, "blame": exc.blame})
        return 2
    message = report.to_json()
    if relays:
        # which guest connection each relay stream carried: the host's proxy records name
        # only the host end, and the host attributes each to a guest pid by this
        message["relay_streams"] = {str(n): p for r in relays for n, p in r.streams.items()}
    _send(port, message)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""QEMU's side of a boot: its command line (:func:`qemu_argv`: the machine, the virtio-serial
ports, the 9p shares, its seccomp sandbox; :func:`_qemu_escape`), the guest console's tail
(:func:`console_tail`), and whether KVM works here (:func:`kvm_status`: ``/dev/kvm`` opens and a
probe guest reaches init, cached per host boot) behind the backend's :func:`probe`.

Starts QEMU only for the probe boot. Imports the backend interface's ``Part``/``Probe``, the
errors, this package's ``tools`` and ``shares`` (``Share``) and the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
from typing import List, Optional, Sequence, Tuple

from pipguard.errors import PipguardError
from pipguard.sandbox.backends import Part, Probe
from pipguard.sandbox.vm.shares import Share
from pipguard.sandbox.vm.tools import NAME, PROBE_OK, Tools, write_atomic, cache_dir, find_tools, initramfs

ACCELS = ("kvm", "tcg")
#: i440fx boots faster than q35 under TCG here (7.2 s against 9.9 s to the
#: end of init, loaded 2-vCPU host); ``microvm`` hung in timer calibration
#: with virtio devices attached (QEMU 7.2, Debian's 6.1 kernel)
MACHINE = "pc"
#: a working KVM reaches init in well under a second; a nested KVM that hangs
#: in the decompressor never does
PROBE_TIMEOUT = 8.0
CONSOLE_TAIL_LINES = 40
_ANSI = re.compile(r"\x1b\[[;?0-9]*[a-zA-Z]|\x1bc|\r")


# -- qemu command lines -------------------------------------------------------

def qemu_argv(tools: Tools, initrd: str, accel: str, *, console: str, append: str = "",
               memory_mb: int = 512, ports: Sequence[Tuple[str, str]] = (),
               shares: Sequence[Tuple[str, Share]] = (), net_socket: Optional[str] = None) -> List[str]:
    argv = [tools.qemu, "-M", MACHINE, "-accel", accel, "-cpu", "host" if accel == "kvm" else "max",
            "-m", str(memory_mb), "-smp", str(min(4, os.cpu_count() or 1)) if accel == "kvm" else "1",
            "-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot",
            "-nic", "none", "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            "-kernel", tools.kernel.path, "-initrd", initrd,
            "-append", f"console=ttyS0 quiet panic=-1 {append}".strip(),
            "-chardev", f"file,id=console,path={console}", "-serial", "chardev:console"]
    if ports:
        argv += ["-device", "virtio-serial-pci"]
        for name, path in ports:
            argv += ["-chardev", f"file,id={name},path={path},append=on",
                     "-device", f"virtserialport,chardev={name},name={name}"]
        if net_socket is not None:  # QEMU connects to our listener at start (a client chardev)
            argv += ["-chardev", f"socket,id=net,path={_qemu_escape(net_socket)}",
                     "-device", "virtserialport,chardev=net,name=net"]
    for tag, share in shares:
        model = "mapped-xattr,fmode=0644,dmode=0755" if share.writable else "none,readonly=on"
        argv += ["-fsdev", f"local,id={tag},path={_qemu_escape(share.path)},security_model={model}",
                 "-device", f"virtio-9p-pci,fsdev={tag},mount_tag={tag}"]
    return argv


def _qemu_escape(value: str) -> str:
    return value.replace(",", ",,")  # QEMU's option syntax


def console_tail(path: str) -> List[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [line for line in _ANSI.sub("", text).split("\n") if line.strip()]
    tail = lines[-CONSOLE_TAIL_LINES:]
    # why a guest died is its panic line, which a long call trace pushes out of the tail
    cause = [line for line in lines[:-CONSOLE_TAIL_LINES] if "Kernel panic" in line or "Oops:" in line]
    return ([cause[-1], "..."] if cause else []) + tail


# -- KVM: present is not working ----------------------------------------------

def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return "unknown"


def kvm_status(tools: Tools, *, refresh: bool = False) -> Tuple[bool, str]:
    """Whether a KVM guest boots here: ``/dev/kvm`` opens *and* a probe boot
    reaches init within PROBE_TIMEOUT (nested virtualisation can give a KVM
    whose guests hang in the kernel's decompressor). Cached per host boot,
    QEMU and kernel."""
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        return False, f"/dev/kvm: {exc.strerror}"
    key = hashlib.sha256(json.dumps([_boot_id(), tools.qemu, os.stat(tools.qemu).st_mtime_ns,
                                     tools.kernel.path]).encode()).hexdigest()[:16]
    cached = os.path.join(cache_dir(), f"kvm-{key}.json")
    if not refresh:
        try:
            with open(cached, encoding="utf-8") as fh:
                data = json.load(fh)
            return bool(data["ok"]), str(data["reason"])
        except (OSError, ValueError, KeyError):
            pass
    ok, reason = _probe_boot(tools)
    write_atomic(cached, json.dumps({"ok": ok, "reason": reason, "when": time.time()}).encode())
    return ok, reason


def _probe_boot(tools: Tools) -> Tuple[bool, str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pipguard-kvm-probe-") as tmp:
        console = os.path.join(tmp, "console")
        argv = qemu_argv(tools, initramfs(tools), "kvm", console=console, append="pipguard.probe",
                          memory_mb=256)
        started = time.monotonic()
        with open(os.path.join(tmp, "qemu.err"), "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        try:
            proc.wait(PROBE_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        took = time.monotonic() - started
        tail = console_tail(console)
        if any(PROBE_OK in line for line in tail):
            return True, ""
        with open(os.path.join(tmp, "qemu.err"), "rb") as fh:
            err_text = fh.read().decode("utf-8", "replace").strip().splitlines()
        if proc.returncode not in (0, -signal.SIGKILL) and err_text:
            return False, f"qemu -accel kvm failed: {err_text[-1]}"
        return False, (f"/dev/kvm opens but a probe guest did not reach init in {took:.0f} s "
                       "(nested virtualisation?)")


def probe(*, refresh: bool = False) -> Probe:
    """What the VM backend needs here, each part with its reason: qemu, a
    kernel with its modules, a static busybox, and KVM present and working.
    Without the ``kvm`` part the backend still runs under ``vm_accel="tcg"``."""
    tools, parts = find_tools()
    if tools is None:
        return Probe(NAME, parts + (Part("kvm", "not probed: " + next(p.reason for p in parts if p.reason)),))
    try:
        ok, reason = kvm_status(tools, refresh=refresh)
    except (OSError, PipguardError) as exc:
        ok, reason = False, f"probe failed: {exc}"
    return Probe(NAME, parts + (Part("kvm", "" if ok else reason),))

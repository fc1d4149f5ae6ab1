"""What a VM boot needs, found on this host, and the guest's initramfs built from it: QEMU
(:func:`find_qemu`), a kernel readable by this user with its modules in load order
(:class:`Kernel`, :func:`find_kernel`: ``modules.dep``), a static busybox
(:func:`find_busybox`), all three together (:class:`Tools`, :func:`find_tools`), the guest's
init script (``INIT``) and the initramfs (:func:`initramfs`: a newc cpio) kept in pipguard's
private cache (:func:`cache_dir`).

Starts no process. Imports the backend interface's ``Part`` (and, when called, pipguard's
cache directory) and the standard library.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from pipguard.sandbox.backends import Part

NAME = "vm"
QEMU = "qemu-system-x86_64"
#: modules the guest needs before it can mount anything (their dependencies
#: come from ``modules.dep``); built-in ones (``modules.builtin``) are skipped
GUEST_MODULES = ("virtio_pci", "virtio_console", "9pnet_virtio", "9p")
PROBE_OK = "pipguard-vm-probe-ok"
NINEP = "trans=virtio,version=9p2000.L,msize=262144"


# The guest's /init. Runs as the guest's root; everything the host decided for
# this run is in /run/pipguard (a read-only share): env.sh, mounts.sh, config.json.
INIT = r"""#!/.pg/busybox sh
BB=/.pg/busybox
$BB mount -t proc proc /proc
$BB mount -t sysfs sys /sys
$BB mount -t devtmpfs dev /dev
# what udev would add: bash's process substitution (makepkg) needs /dev/fd
$BB ln -s /proc/self/fd /dev/fd; $BB ln -s fd/0 /dev/stdin; $BB ln -s fd/1 /dev/stdout; $BB ln -s fd/2 /dev/stderr
$BB ip link set lo up 2>/dev/null || $BB ifconfig lo 127.0.0.1 up
for m in @MODULES@; do $BB insmod /.pg/modules/$m.ko || echo "pipguard-vm: insmod $m failed"; done
case " $($BB cat /proc/cmdline) " in
  *" pipguard.probe "*) echo "@PROBE_OK@"; $BB reboot -f;;
esac
$BB mkdir -p /run/pipguard
$BB mount -t 9p -o @NINEP@,ro pgcfg /run/pipguard || echo "pipguard-vm: no config share"
. /run/pipguard/env.sh
. /run/pipguard/mounts.sh
n=0
while [ $n -lt 50 ]; do
  for d in /sys/class/virtio-ports/*; do
    [ -e "$d/name" ] && $BB ln -sf "/dev/${d##*/}" "/dev/pg.$($BB cat "$d/name")"
  done
  missing=
  for p in $PG_PORTS; do [ -e "/dev/pg.$p" ] || missing=$p; done
  [ -z "$missing" ] && break
  $BB sleep 0.1
  n=$((n+1))
done
# the guest's pipguard runs as the host user's uid (see _vm_guest): its channels must be its own
[ "$PG_UID" = 0 ] || $BB chown "$PG_UID:$PG_GID" /dev/pg.*
[ -f /run/pipguard/prelude.sh ] && . /run/pipguard/prelude.sh
cd "$PG_CWD" && $BB env -i PATH=/usr/bin:/bin "$PG_PYTHON" -m pipguard.sandbox.vm.guest \
  /run/pipguard/config.json /dev/pg.report </dev/null >/dev/pg.stdout 2>/dev/pg.stderr
echo "pipguard-vm: guest driver exited with status $?"
$BB reboot -f
"""


@dataclass(frozen=True)
class Kernel:
    """A kernel the guest can boot, with the modules of the same release."""

    path: str
    release: str
    modules: Tuple[str, ...]  # module files to load, dependencies first (relative to modules_dir)
    modules_dir: str


@dataclass(frozen=True)
class Tools:
    """Everything a boot needs, found on this host."""

    qemu: str
    kernel: Kernel
    busybox: str


# -- finding qemu, a kernel, busybox ------------------------------------------

def find_qemu() -> Tuple[Optional[str], str]:
    found = shutil.which(QEMU) or next((p for p in ("/usr/bin/" + QEMU, "/usr/libexec/" + QEMU)
                                        if os.access(p, os.X_OK)), None)
    if not found:
        return None, f"{QEMU} not found (Debian/Ubuntu: apt-get install qemu-system-x86)"
    return found, ""


def _module_order(modules_dir: str) -> Tuple[Optional[Tuple[str, ...]], str]:
    try:
        with open(os.path.join(modules_dir, "modules.dep"), encoding="utf-8") as fh:
            deps = {}
            for line in fh:
                path, _, rest = line.partition(":")
                deps[os.path.basename(path).split(".ko")[0].replace("-", "_")] = (path, rest.split())
    except OSError as exc:
        return None, f"{modules_dir}/modules.dep: {exc.strerror}"
    builtin = ""
    try:
        with open(os.path.join(modules_dir, "modules.builtin"), encoding="utf-8") as fh:
            builtin = fh.read()
    except OSError:
        pass
    order: List[str] = []

    def add(path: str) -> None:
        name = os.path.basename(path).split(".ko")[0].replace("-", "_")
        if path in order:
            return
        for dep in deps[name][1]:
            add(dep)
        order.append(path)

    for name in GUEST_MODULES:
        if name in deps:
            add(deps[name][0])
        elif f"/{name}.ko" not in builtin:
            return None, f"the kernel has no {name} module (needed for virtio-9p shares)"
    for path in order:
        if not path.endswith(".ko"):
            return None, f"{path}: compressed modules are not supported (busybox insmod)"
    return tuple(order), ""


def find_kernel() -> Tuple[Optional[Kernel], str]:
    """The running kernel's release first, then the newest other, that is
    readable and has its modules. ``PIPGUARD_VM_KERNEL`` names one."""
    wanted = os.environ.get("PIPGUARD_VM_KERNEL")
    candidates = [wanted] if wanted else sorted(glob.glob("/boot/vmlinuz-*"), reverse=True)
    running = "/boot/vmlinuz-" + os.uname().release
    if running in candidates:
        candidates.remove(running)
        candidates.insert(0, running)
    if not candidates:
        return None, "no kernel in /boot (Debian: apt-get install linux-image-amd64)"
    reasons = []
    for path in candidates:
        release = os.path.basename(path)[len("vmlinuz-"):] if "vmlinuz-" in path else os.uname().release
        if not os.access(path, os.R_OK):
            reasons.append(f"{path} is not readable by this user (Ubuntu makes kernels mode 0600)")
            continue
        modules_dir = f"/lib/modules/{release}"
        order, why = _module_order(modules_dir)
        if order is None:
            reasons.append(why)
            continue
        return Kernel(path, release, order, modules_dir), ""
    return None, "; ".join(reasons)


def _is_static_elf(path: str) -> bool:
    """True for an ELF64 without a PT_INTERP program header (it runs before
    any library is mounted)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return False
            phoff = int.from_bytes(head[32:40], "little")
            phentsize = int.from_bytes(head[54:56], "little")
            phnum = int.from_bytes(head[56:58], "little")
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
    except OSError:
        return False
    return not any(int.from_bytes(table[i:i + 4], "little") == 3 for i in range(0, len(table), phentsize))


def find_busybox() -> Tuple[Optional[str], str]:
    for path in (shutil.which("busybox"), "/usr/bin/busybox", "/bin/busybox"):
        if path and _is_static_elf(path):
            return path, ""
    return None, "no static busybox (Debian: apt-get install busybox-static)"


def find_tools() -> Tuple[Optional[Tools], Tuple[Part, ...]]:
    qemu, qemu_why = find_qemu()
    kernel, kernel_why = find_kernel()
    busybox, busybox_why = find_busybox()
    parts = (Part("qemu", qemu_why), Part("kernel", kernel_why), Part("busybox", busybox_why))
    if qemu and kernel and busybox:
        return Tools(qemu, kernel, busybox), parts
    return None, parts


# -- the cache and the initramfs ----------------------------------------------

def cache_dir() -> str:
    """pipguard's private cache directory (:mod:`pipguard.cachedir`): the
    KVM probe and the initramfs are kept there, shared by runs with another HOME."""
    from pipguard.cachedir import private_dir

    return private_dir()


def write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _cpio(entries: Sequence[Tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive (what the kernel unpacks as an initramfs)."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], 1):
        raw = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0)
        out += b"070701" + "".join(f"{f:08X}" for f in fields).encode() + raw
        out += b"\0" * (-len(out) % 4) + data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def initramfs(tools: Tools) -> str:
    """The guest's initramfs, built once per kernel, busybox and init script."""
    kernel = tools.kernel
    names = [os.path.basename(p).split(".ko")[0] for p in kernel.modules]
    init = (INIT.replace("@MODULES@", " ".join(names)).replace("@PROBE_OK@", PROBE_OK)
            .replace("@NINEP@", NINEP))
    bb = os.stat(tools.busybox)
    key = hashlib.sha256(json.dumps([init, kernel.release, kernel.modules, bb.st_size, bb.st_mtime_ns,
                                     tools.busybox]).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir(), f"initramfs-{key}.cpio")
    if os.path.exists(path):
        return path
    entries = [(d, 0o40755, b"") for d in (".pg", ".pg/modules", "dev", "proc", "sys", "run", "tmp")]
    with open(tools.busybox, "rb") as fh:
        entries.append((".pg/busybox", 0o100755, fh.read()))
    for rel, name in zip(kernel.modules, names):
        with open(os.path.join(kernel.modules_dir, rel), "rb") as fh:
            entries.append((f".pg/modules/{name}.ko", 0o100644, fh.read()))
    entries.append(("init", 0o100755, init.encode()))
    write_atomic(path, _cpio(entries))
    return path

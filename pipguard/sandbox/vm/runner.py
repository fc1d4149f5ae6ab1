"""The VM backend (``--isolation vm``): the command runs in a QEMU guest.

What the host builds for one run, and why each part is this way:

- **No disk image.** A distribution kernel (``/boot/vmlinuz-*``, with its
  modules in ``/lib/modules/RELEASE``) and an initramfs generated here: a
  static busybox, the few modules the guest needs (virtio PCI, 9p, virtio
  console, resolved from ``modules.dep``) and an init script. It is cached
  (:func:`cache_dir`), keyed by everything it is made from.
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
  directory. After the run (:func:`_settle_mapped`) the guest's permission
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
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pipguard.sandbox.backends import Part, Probe
from pipguard.sandbox.vm.relay import END
from pipguard.errors import LayerUnavailable, PipguardError
from pipguard.sandbox.files import walk

NAME = "vm"
ACCELS = ("kvm", "tcg")
QEMU = "qemu-system-x86_64"
#: i440fx boots faster than q35 under TCG here (7.2 s against 9.9 s to the
#: end of init, loaded 2-vCPU host); ``microvm`` hung in timer calibration
#: with virtio devices attached (QEMU 7.2, Debian's 6.1 kernel)
MACHINE = "pc"
#: modules the guest needs before it can mount anything (their dependencies
#: come from ``modules.dep``); built-in ones (``modules.builtin``) are skipped
GUEST_MODULES = ("virtio_pci", "virtio_console", "9pnet_virtio", "9p")
#: a working KVM reaches init in well under a second; a nested KVM that hangs
#: in the decompressor never does
PROBE_TIMEOUT = 8.0
PROBE_OK = "pipguard-vm-probe-ok"
CONSOLE_TAIL_LINES = 40
#: the report port's content is read up to this size (the guest is untrusted)
REPORT_LIMIT = 64 << 20
NINEP = "trans=virtio,version=9p2000.L,msize=262144"
#: the guest's end of the channel to the host's proxy (the init names ports /dev/pg.NAME)
NET_DEVICE = "/dev/pg.net"
_ANSI = re.compile(r"\x1b\[[;?0-9]*[a-zA-Z]|\x1bc|\r")

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
class Share:
    """One host directory in the guest, at the same path."""

    path: str
    writable: bool


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


def _write_atomic(path: str, data: bytes) -> None:
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
    _write_atomic(path, _cpio(entries))
    return path


# -- qemu command lines -------------------------------------------------------

def _qemu_argv(tools: Tools, initrd: str, accel: str, *, console: str, append: str = "",
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


def _console_tail(path: str) -> List[str]:
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
    _write_atomic(cached, json.dumps({"ok": ok, "reason": reason, "when": time.time()}).encode())
    return ok, reason


def _probe_boot(tools: Tools) -> Tuple[bool, str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pipguard-kvm-probe-") as tmp:
        console = os.path.join(tmp, "console")
        argv = _qemu_argv(tools, initramfs(tools), "kvm", console=console, append="pipguard.probe",
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
        tail = _console_tail(console)
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


# -- one run -----------------------------------------------------------------

def _shares(read: Sequence[str], write: Sequence[str]) -> List[Share]:
    """One share per root, shallowest first; a root inside a share of the
    same kind is left out (the guest sees it through the outer one)."""
    wanted: Dict[str, bool] = {}
    for path in read:
        if os.path.isdir(path) and not os.path.islink(path):
            wanted.setdefault(os.path.realpath(path), False)
    for path in write:
        wanted[os.path.realpath(path)] = True
    out: List[Share] = []
    for path in sorted(wanted, key=lambda p: (p.count("/"), p)):
        parents = [s for s in out if path.startswith(s.path.rstrip("/") + "/")]
        nearest = max(parents, key=lambda s: len(s.path), default=None)
        if nearest is not None and nearest.writable == wanted[path]:
            continue
        out.append(Share(path, wanted[path]))
    return out


def _stage_etc(dest: str, entries: Sequence[str]) -> None:
    """Copy the granted entries of /etc (symlinks as symlinks); unreadable
    ones are left out."""
    os.makedirs(dest, exist_ok=True)
    for src in entries:
        target = os.path.join(dest, os.path.relpath(src, "/etc"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            if os.path.islink(src):
                os.symlink(os.readlink(src), target)
            elif os.path.isdir(src):
                shutil.copytree(src, target, symlinks=True, ignore_dangling_symlinks=True)
            elif os.path.isfile(src):
                shutil.copy2(src, target)
        except (OSError, shutil.Error):
            continue


def _system_layout() -> Tuple[List[str], List[Tuple[str, str]]]:
    """The host's top-level system directories to share, and its top-level
    symlinks (``/bin -> usr/bin`` on merged-/usr systems) to recreate."""
    from pipguard.rules import SYSTEM_READ

    dirs, links = [], []
    for path in SYSTEM_READ:
        if path in ("/proc", "/sys"):
            continue  # the guest has its own
        if os.path.islink(path) and path.count("/") == 1:
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            dirs.append(path)
    return dirs, links


def _memory_mb(policy) -> int:
    if policy.limit_memory:
        return max(256, policy.limit_memory >> 20)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    except (ValueError, OSError):
        total = 2048
    return max(256, min(2048, total // 2))


def _output_path(fd: int, run_dir: str, name: str) -> Tuple[str, bool]:
    """Where QEMU writes a guest stream: this process's own fd ``fd``
    reopened through /proc when it is a terminal or a pipe we may reopen
    (the output streams), else a file copied to ``fd`` at the end (True): a regular file
    reopened would have its own offset, and this process's later writes to
    ``fd`` would overwrite the guest's."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return os.devnull, False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        try:
            # QEMU runs as this user: it can reopen the pipe only if we can (a pipe
            # another user made and handed to us, e.g. root's to nobody's, is mode 0600)
            os.close(os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC))
            return f"/proc/{os.getpid()}/fd/{fd}", False
        except OSError:
            pass  # then copied at the end, not streamed
    return os.path.join(run_dir, name), True


def _read_guest_message(path: str) -> Optional[Dict[str, Any]]:
    """The guest's report, if it arrived whole (None otherwise)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(REPORT_LIMIT + 1)
    except OSError:
        return None
    if len(data) > REPORT_LIMIT or not data.endswith(END):
        return None
    try:
        message = json.loads(data[: -len(END)].decode("utf-8"))
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def preflight(accel: str) -> Tools:
    """The tools of a boot under ``accel``, or :class:`LayerUnavailable`
    with the reason (exit 2 at the CLI, before anything ran): install and
    sandbox call it before pip starts."""
    tools, parts = find_tools()
    if tools is None:
        raise LayerUnavailable("the VM backend is unavailable: " + Probe(NAME, parts).reason,
                               hint="pipguard doctor lists what is missing")
    if accel == "kvm":
        ok, reason = kvm_status(tools)
        if not ok:
            raise LayerUnavailable(f"KVM does not work here: {reason}",
                                   hint="add --vm-accel tcg to run under software emulation (slow), "
                                        "or use --isolation auto")
    return tools


def _check_guest_code() -> None:
    """The guest runs this interpreter and this pipguard from read-only shares
    that QEMU reads as this process's uid. Refused here, before a boot, when
    that uid cannot: ``pkgbuild``'s worker (switched from root to the build
    user) with pipguard or its interpreter under a 0700 home (``/root``)."""
    import pipguard

    for what, path in (("interpreter", sys.executable), ("package", os.path.dirname(pipguard.__file__))):
        if not os.access(path, os.R_OK | os.X_OK):
            raise LayerUnavailable(
                f"the VM's guest could not start pipguard: uid {os.getuid()}, which runs QEMU, cannot "
                f"read pipguard's {what} {path}",
                hint="install pipguard (and its interpreter) where that user can read them, e.g. a "
                     "virtual environment outside a private home")


def run(argv: Sequence[str], policy, *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
        record_build_dir: bool = False, progress=None, unsafe_guest_prelude: Optional[str] = None):
    """Run ``argv`` in a VM under ``policy`` (``policy.isolation == "vm"``)
    and return the :class:`~pipguard.report.model.Report`.

    Raises :class:`~pipguard.errors.LayerUnavailable` before anything runs
    when qemu, a kernel or a static busybox is missing, when
    ``policy.vm_accel`` is ``"kvm"`` and KVM does not work here, or when the
    policy asks for the whole network (``allow_hosts`` is served: see the
    module's docstring). ``unsafe_guest_prelude``
    is shell code the guest's init runs as guest root before pipguard starts
    (tests use it to crash the guest kernel); never take it from a user.
    """
    from pipguard.sandbox.plan import cleanup, make_plan

    notify = progress or (lambda message: None)
    if policy.allow_network:
        raise LayerUnavailable("the VM backend gives no full network: --allow-network cannot be used "
                               "with --isolation vm",
                               hint="name the hosts the build needs (--allow-host / --allow-build-host): "
                                    "the guest reaches them through pipguard's filtering proxy")
    tools = preflight(policy.vm_accel)
    _check_guest_code()
    accel = policy.vm_accel
    argv = [os.fspath(a) for a in argv]
    source_env = dict(os.environ if env is None else env)
    proxy = _start_proxy(policy.allow_hosts)
    try:
        # the host's plan names the host's proxy (the guest's pipguard plans its own relay)
        plan = make_plan(argv, policy, cwd=cwd, env=source_env, proxy_port=proxy.port if proxy else None)
        try:
            return _run_planned(plan, policy, tools, accel, source_env, record_build_dir, notify,
                                unsafe_guest_prelude, proxy)
        finally:
            cleanup(plan)
    finally:
        if proxy is not None:
            proxy.__exit__(None, None, None)


def _run_planned(plan, policy, tools: Tools, accel: str, source_env: Mapping[str, str],
                 record_build_dir: bool, notify, prelude: Optional[str], proxy):
    from pipguard.sandbox.plan import _etc_entries as etc_entries
    from pipguard.sandbox.plan import scrub_env

    started_at = time.time()
    run_dir = plan.run_dir
    private = (plan.tmp_dir, plan.home_dir)
    write_roots = [r for r in plan.write_roots if r not in private]
    system_dirs, links = _system_layout()
    read_roots = [*system_dirs, *plan.read_roots]
    shares = _shares(read_roots, write_roots)
    guest_dir = os.path.join(run_dir, "guest")
    os.mkdir(guest_dir, 0o700)
    _stage_etc(os.path.join(run_dir, "etc"), etc_entries())

    # What the guest's init reads (mounts.sh is generated: every path quoted)
    q = shlex.quote
    # the kernel's built-in initramfs part makes /root mode 0700; in the guest it holds only
    # mount points (a pyenv interpreter in /root/.pyenv), which a non-root guest user must reach
    mounts = ["$BB mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp", "$BB chmod 0755 /root"]
    for link, target in links:
        mounts.append(f"$BB ln -s {q(target)} {q(link)}")
    tagged = [(f"s{i}", share) for i, share in enumerate(shares)]
    for tag, share in tagged:
        # read-only on the host (readonly=on: the boundary), not in the guest: a guest-side ro
        # mount answers access(W_OK) with EROFS where the host answers from the file's mode
        # (makepkg's [[ -w $SRCDEST ]] on the build phase's read-only sources); the guest's
        # Landlock refuses, and reports, the sandbox's writes there as on the host
        mode = "rw,cache=mmap" if share.writable else "cache=loose"
        mounts.append(f"$BB mkdir -p {q(share.path)} && "
                      f"$BB mount -t 9p -o {NINEP},{mode} {tag} {q(share.path)}")
    mounts += ["$BB mkdir -p /etc && $BB mount -t 9p -o " + NINEP + ",ro,cache=loose pgetc /etc",
               "$BB mkdir -p /dev/shm && $BB mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm"]
    with open(os.path.join(guest_dir, "mounts.sh"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(mounts) + "\n")
    with open(os.path.join(guest_dir, "env.sh"), "w", encoding="utf-8") as fh:
        fh.write(f"PG_CWD={q(plan.cwd)}\nPG_PYTHON={q(sys.executable)}\n"
                 f"PG_PORTS={q(' '.join(['report', 'stdout', 'stderr'] + ['net'] * bool(proxy)))}\n"
                 f"PG_UID={os.getuid()}\nPG_GID={os.getgid()}\n")
    if prelude:
        with open(os.path.join(guest_dir, "prelude.sh"), "w", encoding="utf-8") as fh:
            fh.write(prelude + "\n")
    kept, _removed = scrub_env(source_env, policy.keep_env)
    # the guest is the boundary: inside it, the plain layers on the guest's own filesystem
    inner = dict(policy.to_json(), isolation="auto", prefer_ns=False, timeout=None, vm_accel="kvm")
    with open(os.path.join(guest_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump({"argv": list(plan.argv), "cwd": plan.cwd, "env": kept, "policy": inner,
                   "uid": os.getuid(), "gid": os.getgid(),
                   "net_device": NET_DEVICE if proxy else None}, fh)

    console = os.path.join(run_dir, "console.log")
    report_port = os.path.join(run_dir, "report.out")
    stdout, copy_out = _output_path(1, run_dir, "stdout.out")
    stderr, copy_err = _output_path(2, run_dir, "stderr.out")
    network = _Network.start(proxy, os.path.join(run_dir, "net.sock")) if proxy else None
    try:
        qemu_argv = _qemu_argv(
            tools, initramfs(tools), accel, console=console, memory_mb=_memory_mb(policy),
            ports=(("report", report_port), ("stdout", stdout), ("stderr", stderr)),
            shares=[*tagged, ("pgcfg", Share(guest_dir, False)),
                    ("pgetc", Share(os.path.join(run_dir, "etc"), False))],
            net_socket=network.relay.path if network else None)
        return _boot(plan, policy, tools, accel, qemu_argv, shares, network, record_build_dir,
                     write_roots, notify, started_at, console, report_port,
                     ((copy_out, stdout, 1), (copy_err, stderr, 2)))
    finally:
        if network is not None:
            network.stop()


def _start_proxy(hosts):
    """The host's filtering proxy for the plan's hosts, serving (None: no hosts)."""
    if not hosts:
        return None
    from pipguard.sandbox.proxy import Destination, IndexProxy

    return IndexProxy(tuple(Destination(h.host, h.port) for h in hosts)).__enter__()


@dataclass(frozen=True)
class _Network:
    """A run's only network: the host's filtering proxy for the plan's
    hosts (stopped by :func:`run`), and the relay QEMU's ``net`` port connects to."""

    proxy: Any  # pipguard.sandbox.proxy.IndexProxy
    relay: Any  # pipguard.sandbox.vm.relay.HostRelay

    @classmethod
    def start(cls, proxy, socket_path: str) -> "_Network":
        from pipguard.sandbox.vm.relay import HostRelay

        return cls(proxy, HostRelay(socket_path, proxy.port).start())

    def stop(self) -> None:
        self.relay.stop()


#: the attributes QEMU's mapped-xattr model keeps a guest's owner, mode and file type in
MAPPED_PREFIX = "user.virtfs."


MAPPED_MODE = MAPPED_PREFIX + "mode"


def _settle_mapped(root: str) -> None:
    """Leave what the guest made under ``root`` as the host's own files,
    then remove QEMU's mapped attributes (without following symlinks): the
    next VM must see the files as the host does.

    A regular file or directory gets the guest's permission bits (a built
    binary stays executable), as the plain backend would leave them: when
    pipguard runs as root (QEMU's files are root's) without setuid, setgid
    and world-write, so that a guest root cannot plant a setuid-root file. A
    symlink, device node, fifo or socket stays the regular file QEMU made (a
    symlink's holds its target): never turned into the real thing on the host."""
    strip_bits = 0o6002 if os.geteuid() == 0 else 0

    def settle(path: str) -> None:
        try:
            names = [n for n in os.listxattr(path, follow_symlinks=False) if n.startswith(MAPPED_PREFIX)]
            if MAPPED_MODE in names:
                raw = os.getxattr(path, MAPPED_MODE, follow_symlinks=False)
                mode = int.from_bytes(raw[:4], "little")  # QEMU stores it as le32
                kind = os.lstat(path).st_mode
                if len(raw) >= 4 and stat.S_IFMT(mode) == stat.S_IFMT(kind) and \
                        (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
                    # a regular file or directory by lstat, and QEMU is gone: no guest swaps it now
                    os.chmod(path, stat.S_IMODE(mode) & ~strip_bits)
            for name in names:
                os.removexattr(path, name, follow_symlinks=False)
        except OSError:
            pass  # gone, or a filesystem without xattrs (then QEMU kept none either)

    # bottom-up: a directory the guest made 0500 is walked before it gets that mode
    for top, dirs, names in reversed(list(walk(root))):  # children before their parent
        for name in (*dirs, *names):
            settle(os.path.join(top, name))
    settle(root)


#: at most this many relay streams are read from the guest's report (the guest is untrusted)
MAX_GUEST_STREAMS = 4096


def _guest_pids(guest, message: Optional[Mapping[str, Any]], relay) -> Dict[int, int]:
    """Host proxy client port -> the guest pid whose connection carried it:
    the host relay's stream ids (stream -> its connection's port at the
    proxy), the guest's ``relay_streams`` (stream -> the guest-side port of
    the connection the guest's supervisor made for the sandbox) and that
    supervisor's ``supervision.proxy_clients`` (that port -> pid). Guest
    data, so a guest whose kernel was taken over can misattribute (never
    add or hide) a request."""
    raw = message.get("relay_streams") if message else None
    clients = guest.supervision.get("proxy_clients") if guest is not None else None
    if not isinstance(raw, dict) or not isinstance(clients, dict):
        return {}
    out: Dict[int, int] = {}
    for conn_id, guest_port in list(raw.items())[:MAX_GUEST_STREAMS]:
        host_port = relay.streams.get(int(conn_id)) if str(conn_id).isdigit() else None
        pid = clients.get(str(guest_port)) if isinstance(guest_port, int) else None
        if host_port is not None and isinstance(pid, int) and pid > 0:
            out[host_port] = pid
    return out


def _merge_proxy(guest, network: Optional[_Network], max_events: int,
                 message: Optional[Mapping[str, Any]] = None):
    """The guest's events and destinations with the host proxy's records
    added, as ``run`` adds its proxy's (one event per destination and
    outcome), each with the guest pid whose connection carried the request
    (:func:`_guest_pids`; 0 and ``detail.pid`` saying why when it cannot be
    traced). Returns (events renumbered by time, network attempts, events dropped)."""
    from pipguard.report.model import Event, NetworkAttempt

    events = list(guest.events) if guest else []
    attempts = list(guest.network) if guest else []
    dropped = guest.events_dropped if guest else 0
    if network is None:
        return tuple(events), tuple(attempts), dropped
    pids = _guest_pids(guest, message, network.relay)
    seen = set()
    for when, action, host, port, how, client in list(network.proxy.records):
        protocol = "https" if how == "CONNECT" else "http"
        target = f"{host}:{port}"
        if (target, action) in seen:
            continue
        if len(events) >= max_events:
            dropped += 1
            continue
        seen.add((target, action))
        rule = "index-allowed" if action == "allowed" else "not-an-index"
        pid = pids.get(client, 0)
        events.append(Event(0, when, "network", action, "proxy", pid, target, rule,
                            {"protocol": protocol, "method": how, "host": host, "port": port,
                             "seen": "the host's proxy, through the VM's relay",
                             "pid": ("in the guest: the process whose connection the guest's supervisor "
                                     "made" if pid else "unknown: in the guest, not traced to a process")}))
        attempt = NetworkAttempt("inet", protocol, host, port, host, action, pid, "proxy")
        if attempt not in attempts:
            attempts.append(attempt)
    ordered = sorted(events, key=lambda e: (e.time, e.seq))
    renumbered = tuple(Event(i + 1, e.time, e.kind, e.action, e.layer, e.pid, e.target, e.rule, e.detail)
                       for i, e in enumerate(ordered))
    return renumbered, tuple(attempts), dropped


def _boot(plan, policy, tools: Tools, accel: str, qemu_argv: List[str], shares: Sequence[Share],
          network: Optional["_Network"], record_build_dir: bool, write_roots: Sequence[str], notify,
          started_at: float, console: str, report_port: str, copies):
    from pipguard import __version__
    from pipguard.sandbox import files
    from pipguard.report.model import LayerStatus, Report
    from pipguard.report.model import from_json as report_from_json
    from pipguard.sandbox.host import summary as host_summary

    run_dir = plan.run_dir

    roots = [r for r in write_roots if record_build_dir or r != plan.cwd]
    before = files.snapshot(roots)
    notify(f"booting a {accel} VM for {' '.join(plan.argv)[:80]}")
    deadline = None if policy.timeout is None else time.monotonic() + policy.timeout
    timed_out = interrupted = False
    with open(os.path.join(run_dir, "qemu.err"), "wb") as err:
        proc = subprocess.Popen(qemu_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
    try:
        try:
            proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    for copy, path, fd in copies:
        if copy and os.path.exists(path):
            with open(path, "rb") as fh, os.fdopen(os.dup(fd), "wb") as out:
                shutil.copyfileobj(fh, out)

    for share in shares:
        if share.writable:
            _settle_mapped(share.path)
    written = files.changed(before, files.snapshot(roots))
    tail = _console_tail(console)
    with open(os.path.join(run_dir, "qemu.err"), "rb") as fh:
        qemu_err = fh.read(8192).decode("utf-8", "replace").strip()
    message = None if (timed_out or interrupted) else _read_guest_message(report_port)
    if message is not None and "guest_error" in message:
        raise PipguardError(f"in the VM: {message['guest_error']}", hint=message.get("hint"))
    vm = {"accel": accel, "machine": MACHINE, "qemu": tools.qemu, "kernel": tools.kernel.path,
          "memory_mb": _memory_mb(policy),
          "network": ({"proxy": f"127.0.0.1:{network.proxy.port}", "channel": "virtio-serial",
                       "connections": network.relay.opened} if network else "none"),
          "shares": [{"path": s.path, "writable": s.writable} for s in shares],
          "qemu_exit": proc.returncode, "guest_report": message is not None, "console_tail": tail}
    if qemu_err:
        vm["qemu_stderr"] = qemu_err[-2000:]
    guest = report_from_json(message) if message is not None else None
    error = None
    if interrupted:
        error = "interrupted: the VM was stopped by a signal to pipguard"
    elif timed_out:
        pass
    elif guest is None:
        error = ("the VM stopped before the guest sent its report (its kernel crashed, or its init "
                 "failed): see vm.console_tail")
    applied = ("vm", *guest.isolation.applied) if guest else ("vm",)
    unavailable = dict(guest.isolation.unavailable) if guest else {}
    if accel == "tcg":
        unavailable["vm.kvm"] = "software emulation (--vm-accel tcg) was asked for"
    events, attempts, dropped = _merge_proxy(guest, network, policy.max_events, message)
    return Report(
        command=tuple(plan.argv), exit_code=guest.exit_code if guest else None,
        timed_out=timed_out or bool(guest and guest.timed_out),
        isolation=LayerStatus(policy.isolation, applied, unavailable),
        events=events, processes=guest.processes if guest else (),
        network=attempts, files_written=tuple(written),
        env_removed=plan.env_removed, events_dropped=dropped,
        policy=policy.to_json(), host=host_summary(), cwd=plan.cwd, started_at=started_at,
        duration=round(time.time() - started_at, 4), error=error, tool_version=__version__,
        supervision=guest.supervision if guest else {},
        limits=dict(message.get("limits") or {}) if message else {},
        limit_hit=message.get("limit_hit") if message else None, vm=vm,
    )


__all__ = ["ACCELS", "Kernel", "Share", "Tools", "find_tools", "initramfs", "kvm_status", "probe", "run"]

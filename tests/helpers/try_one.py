#!/usr/bin/env python3
"""try_one.py: try exactly ONE action and print the outcome as one JSON line (stdlib only, 3.9+).

    try_one.py ACTION [ARG...]
      read PATH | write PATH | connect-tcp HOST PORT | sendto-udp HOST PORT | unix-connect PATH
      socket-unix | ptrace-traceme | fork | exec PATH | kill PID SIG | dns NAME | io-uring
    -> {"action": "read", "ok": false, "errno": 13, "errname": "EACCES"}

Exit status 0 whatever the outcome, 2 on a usage error. Same actions and output as try_one.c
(plus ``dns``), so a test can check the Python path (audit hooks see it) and the native path
(they do not). For ``dns`` a resolver failure reports the negative EAI code and its name
(e.g. -2 EAI_NONAME). ``dns`` uses the system resolver: only names from /etc/hosts
(``localhost``) stay on this machine.
"""
import ctypes
import errno
import json
import os
import socket
import sys

USAGE = ("usage: try_one.py ACTION [ARG...]\n"
         "  read PATH | write PATH | connect-tcp HOST PORT | sendto-udp HOST PORT |\n"
         "  unix-connect PATH | socket-unix | ptrace-traceme | fork | exec PATH |\n"
         "  kill PID SIG | dns NAME | io-uring | read-at DIR NAME | read-from DIR NAME |\n"
         "  setxattr PATH NAME HEX | chmod PATH OCTAL | list DIR\n")
NARGS = {"read": 1, "write": 1, "connect-tcp": 2, "sendto-udp": 2, "unix-connect": 1,
         "socket-unix": 0, "ptrace-traceme": 0, "fork": 0, "exec": 1, "kill": 2, "dns": 1,
         "io-uring": 0, "read-at": 2, "read-from": 2, "setxattr": 3, "chmod": 2, "list": 1}
SYS_IO_URING_SETUP = 425  # same number on x86_64 and aarch64
PTRACE_TRACEME = 0


class Usage(Exception):
    pass


def _numeric(host, port, type_):
    try:
        return socket.getaddrinfo(host, int(port), 0, type_, 0,
                                  socket.AI_NUMERICHOST | socket.AI_NUMERICSERV)[0]
    except (ValueError, socket.gaierror):
        raise Usage("HOST must be a numeric address, PORT a number")


def _oserror_from_ctypes():
    e = ctypes.get_errno()
    return OSError(e, os.strerror(e))


def act(action, args):
    """Do the action; return on success, raise OSError (or socket.gaierror) on failure."""
    if action == "read":
        fd = os.open(args[0], os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.read(fd, 1)
        finally:
            os.close(fd)
    elif action in ("read-at", "read-from"):
        # NAME relative to DIR: through a directory fd, or after chdir(DIR)
        if action == "read-from":
            os.chdir(args[0])
            fd = os.open(args[1], os.O_RDONLY | os.O_CLOEXEC)
        else:
            dirfd = os.open(args[0], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fd = os.open(args[1], os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
            finally:
                os.close(dirfd)
        try:
            os.read(fd, 1)
        finally:
            os.close(fd)
    elif action == "list":
        os.listdir(args[0])  # the os.listdir audit event, then open + getdents
    elif action == "write":
        fd = os.open(args[0], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
    elif action == "connect-tcp":
        fam, typ, proto, _, addr = _numeric(args[0], args[1], socket.SOCK_STREAM)
        with socket.socket(fam, typ, proto) as s:
            s.connect(addr)
            s.sendall(b"try_one")
    elif action == "sendto-udp":
        fam, typ, proto, _, addr = _numeric(args[0], args[1], socket.SOCK_DGRAM)
        with socket.socket(fam, typ, proto) as s:
            s.sendto(b"try_one", addr)
    elif action == "unix-connect":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(args[0])
    elif action == "socket-unix":
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
    elif action == "ptrace-traceme":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.restype = ctypes.c_long
        if libc.ptrace(ctypes.c_long(PTRACE_TRACEME), 0, None, None) != 0:
            raise _oserror_from_ctypes()
    elif action == "fork":
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    elif action == "exec":
        # exec in a child so we are still here to report; its errno comes back through a pipe
        # (os.pipe is close-on-exec, so EOF without data means exec succeeded).
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 1)
                os.execv(args[0], [args[0]])
            except OSError as exc:
                os.write(w, str(exc.errno).encode())
            finally:
                os._exit(127)
        os.close(w)
        data = os.read(r, 64)
        os.close(r)
        os.waitpid(pid, 0)
        if data:
            e = int(data)
            raise OSError(e, os.strerror(e))
    elif action == "kill":
        try:
            pid, sig = int(args[0]), int(args[1])
        except ValueError:
            raise Usage("PID and SIG must be numbers")
        os.kill(pid, sig)
    elif action == "io-uring":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed = defaults
        fd = libc.syscall(ctypes.c_long(SYS_IO_URING_SETUP), ctypes.c_uint(1), params)
        if fd < 0:
            raise _oserror_from_ctypes()
        os.close(fd)
    elif action == "dns":
        socket.getaddrinfo(args[0], None)
    elif action == "setxattr":
        os.setxattr(args[0], args[1], bytes.fromhex(args[2]), follow_symlinks=False)
    elif action == "chmod":
        os.chmod(args[0], int(args[1], 8))
    else:
        raise Usage("unknown ACTION")


def _eai_name(code):
    for name in dir(socket):
        if name.startswith("EAI_") and getattr(socket, name) == code:
            return name
    return "EAI_%d" % code


def main(argv):
    if not argv:
        raise Usage("missing ACTION")
    action, args = argv[0], argv[1:]
    if action not in NARGS:
        raise Usage("unknown ACTION")
    if len(args) != NARGS[action]:
        raise Usage("wrong number of arguments")
    result = {"action": action, "ok": True, "errno": 0, "errname": ""}
    try:
        act(action, args)
    except socket.gaierror as exc:
        # CPython raises EAI_SYSTEM as a plain OSError carrying errno (next clause).
        code = exc.errno or 0
        result.update(ok=False, errno=code, errname=_eai_name(code))
    except OSError as exc:
        code = exc.errno or 0
        result.update(ok=False, errno=code, errname=errno.errorcode.get(code, "E%d" % code))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Usage as exc:
        sys.stderr.write("try_one.py: %s\n%s" % (exc, USAGE))
        sys.exit(2)

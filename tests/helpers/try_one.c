/* try_one: try exactly ONE action and report the outcome as one JSON line on stdout.
 *
 *   try_one ACTION [ARG...]
 *     read PATH | write PATH | connect-tcp HOST PORT | sendto-udp HOST PORT | unix-connect PATH
 *     socket-unix | ptrace-traceme | fork | exec PATH | kill PID SIG | io-uring
 *     read-at DIR NAME (openat through a directory fd) | read-from DIR NAME (chdir, then open)
 *     setxattr PATH NAME HEX (lsetxattr: the value's bytes in hex) | chmod PATH OCTAL
 *     list DIR (open it as a directory and read its entries, as readdir does)
 *   -> {"action": "read", "ok": false, "errno": 13, "errname": "EACCES"}
 *
 * Exit status 0 whatever the outcome; 2 on a usage error (and for "dns", python helper only).
 * TRY_ONE_UNDUMPABLE=1 in the environment: the action runs non-dumpable (C helper only).
 * The idea is bubblewrap's tests/try-syscall.c: sandbox tests run this under the sandbox and
 * compare errno, so a test checks the kernel's answer, not a log message.
 * Keep the action list in sync with try_one.py. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_io_uring_setup
#define SYS_io_uring_setup 425
#endif

static const struct { int num; const char *name; } NAMES[] = {
    {EPERM, "EPERM"}, {ENOENT, "ENOENT"}, {ESRCH, "ESRCH"}, {EINTR, "EINTR"}, {EIO, "EIO"},
    {ENXIO, "ENXIO"}, {E2BIG, "E2BIG"}, {ENOEXEC, "ENOEXEC"}, {EBADF, "EBADF"},
    {ECHILD, "ECHILD"}, {EAGAIN, "EAGAIN"}, {ENOMEM, "ENOMEM"}, {EACCES, "EACCES"},
    {EFAULT, "EFAULT"}, {EBUSY, "EBUSY"}, {EEXIST, "EEXIST"}, {EXDEV, "EXDEV"},
    {ENODEV, "ENODEV"}, {ENOTDIR, "ENOTDIR"}, {EISDIR, "EISDIR"}, {EINVAL, "EINVAL"},
    {ENFILE, "ENFILE"}, {EMFILE, "EMFILE"}, {ETXTBSY, "ETXTBSY"}, {ENOSPC, "ENOSPC"},
    {EROFS, "EROFS"}, {EPIPE, "EPIPE"}, {ENAMETOOLONG, "ENAMETOOLONG"}, {ENOSYS, "ENOSYS"},
    {ELOOP, "ELOOP"}, {ENOTSOCK, "ENOTSOCK"}, {EPROTOTYPE, "EPROTOTYPE"},
    {EPROTONOSUPPORT, "EPROTONOSUPPORT"}, {EOPNOTSUPP, "EOPNOTSUPP"},
    {EAFNOSUPPORT, "EAFNOSUPPORT"}, {EADDRINUSE, "EADDRINUSE"},
    {EADDRNOTAVAIL, "EADDRNOTAVAIL"}, {ENETDOWN, "ENETDOWN"}, {ENETUNREACH, "ENETUNREACH"},
    {ECONNABORTED, "ECONNABORTED"}, {ECONNRESET, "ECONNRESET"}, {ENOTCONN, "ENOTCONN"},
    {ETIMEDOUT, "ETIMEDOUT"}, {ECONNREFUSED, "ECONNREFUSED"}, {EHOSTUNREACH, "EHOSTUNREACH"},
    {EALREADY, "EALREADY"}, {EINPROGRESS, "EINPROGRESS"}, {ECANCELED, "ECANCELED"},
};

static const char *errname(int e) {
    static char buf[32];
    if (e == 0) return "";
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (NAMES[i].num == e) return NAMES[i].name;
    snprintf(buf, sizeof buf, "E%d", e);
    return buf;
}

static int emit(const char *action, int ok, int err) {
    if (ok) err = 0;
    printf("{\"action\": \"%s\", \"ok\": %s, \"errno\": %d, \"errname\": \"%s\"}\n",
           action, ok ? "true" : "false", err, errname(err));
    fflush(stdout);
    return 0;
}

/* read one byte from what open() returned (-1 with errno set: report that) */
static int read_one(const char *a, int fd) {
    if (fd < 0) return emit(a, 0, errno);
    char c;
    ssize_t n = read(fd, &c, 1);
    int e = errno;
    close(fd);
    return emit(a, n >= 0, e);
}

static int usage(const char *msg) {
    fprintf(stderr, "try_one: %s\nusage: try_one ACTION [ARG...]\n"
            "  read PATH | write PATH | connect-tcp HOST PORT | sendto-udp HOST PORT |\n"
            "  unix-connect PATH | socket-unix | ptrace-traceme | fork | exec PATH |\n"
            "  kill PID SIG | io-uring | read-at DIR NAME | read-from DIR NAME |\n"
            "  setxattr PATH NAME HEX | chmod PATH OCTAL | list DIR\n", msg);
    return 2;
}

/* Numeric address only: a name would need DNS, which is its own action. */
static int resolve(const char *host, const char *port, int type, struct addrinfo **ai) {
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = type;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    return getaddrinfo(host, port, &hints, ai);
}

int main(int argc, char **argv) {
    if (argc < 2) return usage("missing ACTION");
    /* TRY_ONE_UNDUMPABLE=1: first make this process non-dumpable, so that a supervisor
     * without CAP_SYS_PTRACE over it cannot read its memory (the syscall's arguments) */
    if (getenv("TRY_ONE_UNDUMPABLE") && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        return usage("prctl(PR_SET_DUMPABLE) failed");
    const char *a = argv[1];
    int nargs = argc - 2;

#define NEED(n) do { if (nargs != (n)) return usage("wrong number of arguments"); } while (0)

    if (!strcmp(a, "read")) {
        NEED(1);
        int fd = open(argv[2], O_RDONLY | O_CLOEXEC);
        return read_one(a, fd);
    }
    if (!strcmp(a, "read-at") || !strcmp(a, "read-from")) {
        NEED(2);
        int fd;
        if (!strcmp(a, "read-from")) {
            if (chdir(argv[2]) < 0) return emit(a, 0, errno);
            fd = open(argv[3], O_RDONLY | O_CLOEXEC);
        } else {
            int dirfd = open(argv[2], O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (dirfd < 0) return emit(a, 0, errno);
            fd = openat(dirfd, argv[3], O_RDONLY | O_CLOEXEC);
            int e = errno;
            close(dirfd);
            errno = e;
        }
        return read_one(a, fd);
    }
    if (!strcmp(a, "list")) {
        NEED(1);
        int fd = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return emit(a, 0, errno);
        char entries[4096];
        long n = syscall(SYS_getdents64, fd, entries, sizeof entries);
        int e = errno;
        close(fd);
        return emit(a, n >= 0, e);
    }
    if (!strcmp(a, "write")) {
        NEED(1);
        int fd = open(argv[2], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0) return emit(a, 0, errno);
        ssize_t n = write(fd, "x", 1);
        int e = errno;
        close(fd);
        return emit(a, n == 1, e);
    }
    if (!strcmp(a, "connect-tcp") || !strcmp(a, "sendto-udp")) {
        NEED(2);
        int tcp = !strcmp(a, "connect-tcp");
        struct addrinfo *ai = NULL;
        if (resolve(argv[2], argv[3], tcp ? SOCK_STREAM : SOCK_DGRAM, &ai) != 0)
            return usage("HOST must be a numeric address, PORT a number");
        int s = socket(ai->ai_family, (tcp ? SOCK_STREAM : SOCK_DGRAM) | SOCK_CLOEXEC, 0);
        if (s < 0) { int e = errno; freeaddrinfo(ai); return emit(a, 0, e); }
        int ok, e;
        if (tcp) {
            ok = connect(s, ai->ai_addr, ai->ai_addrlen) == 0;
            e = errno;
            if (ok) { ssize_t n = send(s, "try_one", 7, MSG_NOSIGNAL); ok = n == 7; e = errno; }
        } else {
            ok = sendto(s, "try_one", 7, 0, ai->ai_addr, ai->ai_addrlen) == 7;
            e = errno;
        }
        close(s);
        freeaddrinfo(ai);
        return emit(a, ok, e);
    }
    if (!strcmp(a, "unix-connect")) {
        NEED(1);
        struct sockaddr_un sun;
        memset(&sun, 0, sizeof sun);
        sun.sun_family = AF_UNIX;
        if (strlen(argv[2]) >= sizeof sun.sun_path) return usage("PATH too long");
        strcpy(sun.sun_path, argv[2]);
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) return emit(a, 0, errno);
        int ok = connect(s, (struct sockaddr *)&sun, sizeof sun) == 0;
        int e = errno;
        close(s);
        return emit(a, ok, e);
    }
    if (!strcmp(a, "socket-unix")) {
        NEED(0);
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int e = errno;
        if (s >= 0) close(s);
        return emit(a, s >= 0, e);
    }
    if (!strcmp(a, "ptrace-traceme")) {
        NEED(0);
        long r = ptrace(PTRACE_TRACEME, 0, NULL, NULL);
        int e = errno; /* read errno after the call: argument evaluation order is unspecified */
        return emit(a, r == 0, e);
    }
    if (!strcmp(a, "fork")) {
        NEED(0);
        pid_t p = fork();
        if (p < 0) return emit(a, 0, errno);
        if (p == 0) _exit(0);
        int st;
        waitpid(p, &st, 0);
        return emit(a, 1, 0);
    }
    if (!strcmp(a, "exec")) {
        NEED(1);
        /* exec in a child, so we are still here to report; the child sends errno back through a
         * close-on-exec pipe (EOF without data = exec succeeded). */
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) != 0) return emit(a, 0, errno);
        pid_t p = fork();
        if (p < 0) return emit(a, 0, errno);
        if (p == 0) {
            int devnull = open("/dev/null", O_RDWR);
            if (devnull >= 0) { dup2(devnull, 0); dup2(devnull, 1); }
            char *args[] = {argv[2], NULL};
            execv(argv[2], args);
            int e = errno;
            if (write(pfd[1], &e, sizeof e) < 0) _exit(126);
            _exit(127);
        }
        close(pfd[1]);
        int e = 0;
        ssize_t n = read(pfd[0], &e, sizeof e);
        close(pfd[0]);
        int st;
        waitpid(p, &st, 0);
        return emit(a, n != (ssize_t)sizeof e, n == (ssize_t)sizeof e ? e : 0);
    }
    if (!strcmp(a, "kill")) {
        NEED(2);
        char *end1, *end2;
        long pid = strtol(argv[2], &end1, 10), sig = strtol(argv[3], &end2, 10);
        if (*end1 || *end2) return usage("PID and SIG must be numbers");
        int r = kill((pid_t)pid, (int)sig);
        int e = errno;
        return emit(a, r == 0, e);
    }
    if (!strcmp(a, "io-uring")) {
        NEED(0);
        unsigned char params[120]; /* struct io_uring_params; zeroed = defaults */
        memset(params, 0, sizeof params);
        long fd = syscall(SYS_io_uring_setup, 1, params);
        int e = errno;
        if (fd >= 0) close((int)fd);
        return emit(a, fd >= 0, e);
    }
    if (!strcmp(a, "setxattr")) {
        NEED(3);
        size_t n = strlen(argv[4]) / 2;
        unsigned char value[4096];
        if (n > sizeof value) return usage("setxattr: value too long");
        for (size_t i = 0; i < n; i++) {
            unsigned int byte;
            if (sscanf(argv[4] + 2 * i, "%2x", &byte) != 1) return usage("setxattr: HEX is not hex");
            value[i] = (unsigned char)byte;
        }
        int r = lsetxattr(argv[2], argv[3], value, n, 0);
        int e = errno;
        return emit(a, r == 0, e);
    }
    if (!strcmp(a, "chmod")) {
        NEED(2);
        int r = chmod(argv[2], (mode_t)strtoul(argv[3], NULL, 8));
        int e = errno;
        return emit(a, r == 0, e);
    }
    if (!strcmp(a, "dns")) return usage("dns: only the python helper (try_one.py) does DNS");
    return usage("unknown ACTION");
}

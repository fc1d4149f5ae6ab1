/* pipguard.sandbox._responder: the hot path of the seccomp user-notification supervisor.
 *
 * Every open() of a sandboxed native process is a notification, and the
 * process is blocked until the supervisor answers. A build opens tens of
 * thousands of headers, libraries and sources; answered from Python each
 * round trip cost ~87 us on a 2-vCPU VM, answered from this thread ~3-5 us.
 *
 * The thread receives every notification (SECCOMP_IOCTL_NOTIF_RECV). It
 * answers itself only opens the Python supervisor would allow without
 * recording anything (handlers.Handlers._file_decision):
 *  - a read of a normalised absolute path under a root the sandbox cannot
 *    write (no symlink of its making on the way), as Python's fast path; or
 *  - any other open (a write, a path under a writable root, a path relative
 *    to the cwd or a dirfd) once resolved like Python resolves it (the
 *    base's kernel name, realpath of the parent, a final component that is
 *    not a symlink), if the result is under an allowed root and not under a
 *    never-fast prefix (the decoy HOME, /proc/, /etc/shadow...).
 * Its prefix tables are not kept here: pipguard.rules.native_tables() builds
 * them from the one rule table at start-up (tests/test_rules.py runs the same
 * cases against this thread, the Python supervisor and the audit hook).
 * It answers CONTINUE: observe, never allow because of what was read
 * (seccomp_unotify(2)); Landlock enforces the same roots in the kernel
 * either way. Every other
 * notification (exec, connect, kill, an open anywhere else, a foreign ABI,
 * anything it cannot read) is forwarded unchanged, as the raw
 * struct seccomp_notif, to the Python supervisor through a pipe; Python
 * decides, records the evidence and answers.
 *
 * No Python object is touched by the thread: it runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define KIND_OPEN 1    /* open(path, flags)               */
#define KIND_CREAT 2   /* creat(path, mode): always writes */
#define KIND_OPENAT 3  /* openat(dirfd, path, flags)       */
#define KIND_OPENAT2 4 /* openat2(dirfd, path, &how)       */
#define MAX_NR 1024
#define PATH_LIMIT 4096
#define X32_BIT 0x40000000u
#define AT_FDCWD_ (-100)

typedef struct {
    char **items;
    size_t *lens;
    Py_ssize_t n;
} prefixes_t;

typedef struct {
    pthread_t thread;
    int listener, forward_fd, stop_fd;
    uint32_t arch;
    uint64_t write_mask;
    unsigned char kinds[MAX_NR];
    prefixes_t fixed_fast, read_fast, write_fast, never_fast;
    /* written by the thread, read after join */
    unsigned long long answered, forwarded;
    int error; /* errno that ended the thread, 0 for a normal stop */
    double cpu_seconds; /* the thread's own CPU time: what answering cost */
} responder_t;

static int starts_with_any(const char *s, const prefixes_t *p)
{
    for (Py_ssize_t i = 0; i < p->n; i++)
        if (strncmp(s, p->items[i], p->lens[i]) == 0)
            return 1;
    return 0;
}

/* Read a NUL-terminated string of the target, page by page (the next page may
 * be unmapped). Returns its length, or -1 if unreadable or too long. */
static ssize_t read_string(pid_t pid, uint64_t addr, char *out, size_t limit)
{
    size_t got = 0;
    if (!addr)
        return -1;
    while (got < limit) {
        size_t chunk = 4096 - ((addr + got) % 4096);
        if (chunk > limit - got)
            chunk = limit - got;
        struct iovec local = {out + got, chunk};
        struct iovec remote = {(void *)(uintptr_t)(addr + got), chunk};
        ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (n <= 0)
            return -1;
        char *nul = memchr(out + got, '\0', (size_t)n);
        if (nul)
            return nul - out;
        got += (size_t)n;
    }
    return -1;
}

/* struct open_how { u64 flags; u64 mode; u64 resolve; } of openat2 */
static int read_how(pid_t pid, uint64_t addr, uint64_t how[3])
{
    struct iovec local = {how, 3 * sizeof(uint64_t)};
    struct iovec remote = {(void *)(uintptr_t)addr, 3 * sizeof(uint64_t)};
    return process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)(3 * sizeof(uint64_t)) ? 0 : -1;
}

/* No "..", "." or empty component that could make a prefix test lie
 * (handlers._normalised). */
static int normalised(const char *path)
{
    size_t len = strlen(path);
    if (strstr(path, "/..") || strstr(path, "//") || strstr(path, "/./"))
        return 0;
    return !(len >= 2 && path[len - 2] == '/' && path[len - 1] == '.');
}

/* Resolve an absolute, normalised path like handlers.Handlers._resolve does
 * (os.path.realpath), but refuse (0) where they could differ: the parent
 * must resolve, the last component must not be a symlink. */
static int resolve(const char *path, char *out)
{
    const char *cut = strrchr(path, '/');
    char parent[PATH_LIMIT + 1];
    char real[PATH_MAX];
    struct stat st;
    size_t plen = (size_t)(cut - path);
    if (!cut[1] || plen >= sizeof parent)
        return 0;
    memcpy(parent, path, plen);
    parent[plen ? plen : 1] = '\0';
    if (!plen)
        parent[0] = '/';
    if (!realpath(parent, real))
        return 0;
    size_t rlen = strlen(real);
    if (rlen == 1)
        rlen = 0; /* "/" */
    if (rlen + 1 + strlen(cut + 1) >= PATH_LIMIT)
        return 0;
    memcpy(out, real, rlen);
    out[rlen] = '/';
    strcpy(out + rlen + 1, cut + 1);
    if (lstat(out, &st) == 0) {
        if (S_ISLNK(st.st_mode))
            return 0;
    } else if (errno != ENOENT) {
        return 0;
    }
    return 1;
}

/* 1: answer CONTINUE here; 0: forward to Python. Mirrors the fast path of
 * Handlers._file_decision, extended to relative paths by joining them to
 * the kernel's canonical name of their base directory. */
static int fast_open(responder_t *r, const struct seccomp_notif *n, int kind)
{
    const uint64_t *a = n->data.args;
    uint64_t path_addr, flags = 0, mode = 0;
    int dirfd = AT_FDCWD_;
    char buf[2 * PATH_LIMIT + 2];
    char *path = buf + PATH_LIMIT + 1; /* room to prepend a base directory */

    switch (kind) {
    case KIND_OPEN: path_addr = a[0]; flags = a[1]; mode = a[2]; break;
    case KIND_CREAT: path_addr = a[0]; flags = O_CREAT | O_WRONLY; mode = a[1]; break;
    case KIND_OPENAT: dirfd = (int)(int32_t)a[0]; path_addr = a[1]; flags = a[2]; mode = a[3]; break;
    case KIND_OPENAT2: {
        uint64_t how[3];
        dirfd = (int)(int32_t)a[0]; path_addr = a[1];
        if (read_how(n->pid, a[2], how) || how[2])
            return 0; /* RESOLVE_* (IN_ROOT changes what "/" means): Python decides */
        flags = how[0];
        mode = how[1];
        break;
    }
    default: return 0;
    }
    /* a new file with a setuid/setgid mode: Python decides (Handlers._file_decision) */
    if ((flags & O_CREAT || (flags & O_TMPFILE) == O_TMPFILE) && (mode & 06000))
        return 0;
    ssize_t len = read_string(n->pid, path_addr, path, PATH_LIMIT);
    if (len <= 0)
        return 0;
    if (path[0] != '/') {
        char link[64];
        char base[PATH_LIMIT + 1];
        if (dirfd == AT_FDCWD_)
            snprintf(link, sizeof link, "/proc/%u/cwd", n->pid);
        else if (dirfd >= 0)
            snprintf(link, sizeof link, "/proc/%u/fd/%d", n->pid, dirfd);
        else
            return 0;
        ssize_t blen = readlink(link, base, PATH_LIMIT);
        if (blen <= 0 || blen >= PATH_LIMIT || base[0] != '/')
            return 0;
        base[blen] = '\0';
        if (strstr(base, " (deleted)"))
            return 0;
        if (blen == 1)
            blen = 0; /* "/" + "/" + rel would give "//rel" */
        path -= blen + 1;
        memcpy(path, base, (size_t)blen);
        path[blen] = '/';
    }
    if (!normalised(path) || starts_with_any(path, &r->never_fast))
        return 0;
    int writing = (flags & r->write_mask) != 0;
    if (!writing && starts_with_any(path, &r->fixed_fast))
        return 1;
    /* realpath runs in our mount/pid view: /proc/self would be ours */
    if (!strncmp(path, "/proc/", 6))
        return 0;
    char resolved[PATH_LIMIT];
    if (!resolve(path, resolved))
        return 0;
    if (starts_with_any(resolved, &r->never_fast))
        return 0;
    return starts_with_any(resolved, writing ? &r->write_fast : &r->read_fast);
}

/* Forward the raw notification to Python; wait for room, but not past a stop. */
static int forward(responder_t *r, const struct seccomp_notif *n)
{
    const char *p = (const char *)n;
    size_t left = sizeof *n;
    while (left) {
        ssize_t w = write(r->forward_fd, p, left);
        if (w > 0) {
            p += w;
            left -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd fds[2] = {{r->forward_fd, POLLOUT, 0}, {r->stop_fd, POLLIN, 0}};
            if (poll(fds, 2, -1) < 0 && errno != EINTR)
                return -1;
            if (fds[1].revents)
                return -1;
            continue;
        }
        return -1;
    }
    return 0;
}

static void *responder_main(void *arg)
{
    responder_t *r = arg;
    /* The kernel writes its own sizeof(struct seccomp_notif) (SECCOMP_GET_NOTIF_SIZES),
     * which a newer kernel may grow: receive into room to spare, zeroed as RECV requires. */
    union {
        struct seccomp_notif n;
        char room[1024];
    } in;
    struct seccomp_notif_resp resp;

    for (;;) {
        struct pollfd fds[2] = {{r->listener, POLLIN, 0}, {r->stop_fd, POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            r->error = errno;
            break;
        }
        if (fds[1].revents)
            break; /* the supervisor asked us to stop */
        if (fds[0].revents & POLLNVAL) {
            r->error = EBADF;
            break;
        }
        if (!(fds[0].revents & POLLIN)) {
            if (fds[0].revents & (POLLHUP | POLLERR))
                break; /* no task uses the filter any more */
            continue;
        }
        memset(&in, 0, sizeof in);
        if (ioctl(r->listener, SECCOMP_IOCTL_NOTIF_RECV, &in) < 0) {
            if (errno == ENOENT || errno == EINTR || errno == EAGAIN)
                continue; /* the target died or was interrupted meanwhile */
            r->error = errno;
            break;
        }
        const struct seccomp_notif n = in.n;
        int kind = 0;
        if (n.data.arch == r->arch && !(n.data.nr & X32_BIT) && n.data.nr >= 0 && n.data.nr < MAX_NR)
            kind = r->kinds[n.data.nr];
        if (kind && fast_open(r, &n, kind)) {
            memset(&resp, 0, sizeof resp);
            resp.id = n.id;
            resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
            /* ENOENT: the target died meanwhile; nothing to answer. */
            ioctl(r->listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
            r->answered++;
            continue;
        }
        if (forward(r, &n) < 0) {
            if (errno != EAGAIN && errno != EINTR)
                r->error = errno;
            break;
        }
        r->forwarded++;
    }
    struct timespec cpu;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
        r->cpu_seconds = cpu.tv_sec + cpu.tv_nsec / 1e9;
    /* End of file tells the supervisor we are gone (it then answers itself). */
    close(r->forward_fd);
    return NULL;
}

static void free_prefixes(prefixes_t *p)
{
    for (Py_ssize_t i = 0; i < p->n; i++)
        free(p->items[i]);
    free(p->items);
    free(p->lens);
    p->items = NULL;
    p->lens = NULL;
    p->n = 0;
}

static int copy_prefixes(PyObject *seq, prefixes_t *out)
{
    PyObject *fast = PySequence_Fast(seq, "prefixes must be a sequence of bytes");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    out->items = calloc((size_t)n + 1, sizeof(char *));
    out->lens = calloc((size_t)n + 1, sizeof(size_t));
    out->n = 0;
    if (!out->items || !out->lens) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        char *data;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(item, &data, &len) < 0) {
            Py_DECREF(fast);
            return -1;
        }
        if (len == 0) { /* an empty prefix would match everything: refuse */
            Py_DECREF(fast);
            PyErr_SetString(PyExc_ValueError, "empty prefix");
            return -1;
        }
        out->items[i] = strndup(data, (size_t)len);
        out->lens[i] = (size_t)len;
        out->n = i + 1;
        if (!out->items[i]) {
            Py_DECREF(fast);
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static void destroy(responder_t *r)
{
    free_prefixes(&r->fixed_fast);
    free_prefixes(&r->read_fast);
    free_prefixes(&r->write_fast);
    free_prefixes(&r->never_fast);
    free(r);
}

#define CAPSULE "pipguard.sandbox._responder.handle"

static PyObject *start(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"listener", "forward_fd", "stop_fd", "arch", "kinds", "fixed_fast",
                            "read_fast", "write_fast", "never_fast", "write_mask", NULL};
    int listener, forward_fd, stop_fd;
    unsigned long arch;
    unsigned long long write_mask;
    PyObject *kinds, *fixed_fast, *read_fast, *write_fast, *never_fast;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiikO!OOOOK", names, &listener, &forward_fd,
                                     &stop_fd, &arch, &PyDict_Type, &kinds, &fixed_fast,
                                     &read_fast, &write_fast, &never_fast, &write_mask))
        return NULL;
    responder_t *r = calloc(1, sizeof *r);
    if (!r)
        return PyErr_NoMemory();
    r->listener = listener;
    r->forward_fd = forward_fd;
    r->stop_fd = stop_fd;
    r->arch = (uint32_t)arch;
    r->write_mask = write_mask;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kinds, &pos, &key, &value)) {
        long nr = PyLong_AsLong(key), kind = PyLong_AsLong(value);
        if (PyErr_Occurred()) {
            destroy(r);
            return NULL;
        }
        if (nr >= 0 && nr < MAX_NR && kind >= KIND_OPEN && kind <= KIND_OPENAT2)
            r->kinds[nr] = (unsigned char)kind;
    }
    if (copy_prefixes(fixed_fast, &r->fixed_fast) || copy_prefixes(read_fast, &r->read_fast) ||
        copy_prefixes(write_fast, &r->write_fast) ||
        copy_prefixes(never_fast, &r->never_fast)) {
        destroy(r);
        return NULL;
    }
    /* The forward pipe must never block the thread forever (see forward()). */
    int fl = fcntl(forward_fd, F_GETFL);
    if (fl < 0 || fcntl(forward_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        destroy(r);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    /* The thread inherits a mask blocking every signal: SIGINT/SIGTERM must
     * reach the main thread, whose epoll they interrupt (Python's handlers run
     * there); delivered here, Ctrl-C would wait for the next event. */
    PyObject *capsule = PyCapsule_New(r, CAPSULE, NULL); /* before the thread: no failure after it */
    if (!capsule) {
        destroy(r);
        return NULL;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int err = pthread_create(&r->thread, NULL, responder_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        PyCapsule_SetName(capsule, "pipguard.sandbox._responder.failed");
        Py_DECREF(capsule);
        destroy(r);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return capsule;
}

static PyObject *join(PyObject *self, PyObject *capsule)
{
    responder_t *r = PyCapsule_GetPointer(capsule, CAPSULE);
    if (!r)
        return NULL;
    if (PyCapsule_SetName(capsule, "pipguard.sandbox._responder.joined"))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(r->thread, NULL);
    Py_END_ALLOW_THREADS
    PyObject *result = Py_BuildValue("(KKid)", r->answered, r->forwarded, r->error,
                                     r->cpu_seconds);
    destroy(r);
    return result;
}

static PyMethodDef methods[] = {
    {"start", (PyCFunction)(void (*)(void))start, METH_VARARGS | METH_KEYWORDS,
     "start(listener, forward_fd, stop_fd, arch, kinds, fixed_fast, read_fast, write_fast, never_fast,"
     " write_mask) -> handle\n\nStart the responder thread on a seccomp listener fd. kinds maps"
     " syscall numbers to 1 open, 2 creat, 3 openat, 4 openat2. Notifications it does not answer"
     " are written, raw, to forward_fd, which the thread owns and closes when it ends. A byte on"
     " stop_fd stops it."},
    {"join", join, METH_O,
     "join(handle) -> (answered, forwarded, errno, cpu_seconds)\n\nWait for the thread to end (write to stop_fd"
     " first) and free it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pipguard.sandbox._responder",
    "Native responder thread for seccomp user notifications (see the C source).", -1, methods,
};

PyMODINIT_FUNC PyInit__responder(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "NOTIF_SIZE", (long)sizeof(struct seccomp_notif)) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* userns_clone: clone(CLONE_NEWUSER) -- the way to a user namespace (and so to chroot) that
 * unshare(2)'s refusal did not cover (found by review, 2026-12-04). Prints one JSON line:
 * {"clone": 0 or errno}; on success the child chroots to /tmp and tries a write, and the
 * parent waits for it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    long pid = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
    if (pid < 0) {
        printf("{\"clone\": %d}\n", errno);
        return 0;
    }
    if (pid == 0) {
        if (chroot("/tmp") == 0) {
            int fd = open("etc/pipguard-chroot-probe", O_WRONLY | O_CREAT, 0644);
            if (fd >= 0) close(fd);
        }
        _exit(0);
    }
    waitpid(pid, 0, 0);
    printf("{\"clone\": 0}\n");
    return 0;
}

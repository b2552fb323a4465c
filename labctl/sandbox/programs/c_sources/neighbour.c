#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    usleep(1500000);
    int ok = 0;
    for (int i = 0; i < 8; i++) {
        pid_t pid = fork();
        if (pid < 0) { printf("ESCAPED the neighbour's fork bomb starved this run: %s\n", strerror(errno)); break; }
        if (pid == 0) _exit(0);
        waitpid(pid, NULL, 0);
        ok++;
    }
    printf("FORKED %d\nSURVIVED\n", ok);
    return 0;
}

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    if (fork() == 0) {
        setsid();
        if (fork() == 0) {
            signal(SIGTERM, SIG_IGN); signal(SIGHUP, SIG_IGN); signal(SIGINT, SIG_IGN);
            if ({close}) {
                int null = open("/dev/null", O_RDWR);
                dup2(null, 0); dup2(null, 1); dup2(null, 2);
            }
            for (;;) sleep(1);
        }
        _exit(0);
    }
    wait(NULL);
    printf("DETACHED\n");
    return 0;
}

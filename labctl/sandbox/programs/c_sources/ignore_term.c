#include <signal.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    signal(SIGTERM, SIG_IGN); signal(SIGINT, SIG_IGN); signal(SIGHUP, SIG_IGN);
    printf("IGNORING\n"); fflush(stdout);
    for (;;) sleep(1);
}

#include <stdio.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN) * 2;
    if (n < 4) n = 4;
    double start = now(), end = start + 2.0;
    for (long i = 0; i < n; i++)
        if (fork() == 0) { while (now() < end) {} _exit(0); }
    while (wait(NULL) > 0) {}
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    printf("CPU %.3f WALL %.3f WORKERS %ld\n", cpu, now() - start, n);
    return 0;
}

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static size_t slurp(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    return got;
}
int main(void) {
    char own[1024], cmd[1024], path[256], stat[1024];
    size_t own_n = slurp("/proc/self/cmdline", own, sizeof own);
    int mine[64], nmine = 0;
    for (int p = getpid(); p > 1 && nmine < 64;) {
        mine[nmine++] = p;
        snprintf(path, sizeof path, "/proc/%d/stat", p);
        size_t n = slurp(path, stat, sizeof stat - 1);
        stat[n] = 0;
        char *close_paren = strrchr(stat, ')');
        if (!close_paren) break;
        p = atoi(close_paren + 4);
    }
    printf("STARTED\n"); fflush(stdout);
    int killed = 0;
    time_t end = time(NULL) + 3;
    while (time(NULL) < end) {
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            int pid = atoi(e->d_name), skip = pid <= 1;
            for (int i = 0; i < nmine; i++) skip |= pid == mine[i];
            if (skip) continue;
            snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
            size_t n = slurp(path, cmd, sizeof cmd);
            if (n == own_n && memcmp(cmd, own, n) == 0 && kill(pid, SIGKILL) == 0) killed++;
        }
        if (d) closedir(d);
        usleep(50000);
    }
    if (killed) printf("ESCAPED killed %d of the other run's pids\n", killed);
    printf("SURVIVED\n");
    return 0;
}

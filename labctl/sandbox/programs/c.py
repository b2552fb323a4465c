"""The attack programs in C."""

from labctl.sandbox.programs import MARKER

C_FORK = """\
#include <unistd.h>
int main(void) { for (;;) fork(); }
"""

C_MEMORY = """\
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    size_t mb = 0;
    while (mb < 2048) {
        char *p = malloc(16 << 20);
        if (!p) { printf("MB %zu malloc failed\\n", mb); return 1; }
        memset(p, 1, 16 << 20);
        mb += 16;
        printf("MB %zu\\n", mb); fflush(stdout);
    }
    printf("ESCAPED allocated %zu MiB\\n", mb);
    return 0;
}
"""

C_MEMORY_THREADS = """\
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t total = 0;
static void *grab(void *arg) {
    (void)arg;
    for (int i = 0; i < 32; i++) {
        char *p = malloc(8 << 20);
        if (!p) return NULL;
        memset(p, 1, 8 << 20);
        pthread_mutex_lock(&lock);
        total += 8;
        printf("MB %zu\\n", total); fflush(stdout);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}
int main(void) {
    pthread_t t[8];
    for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, grab, NULL);
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    if (total >= 2048) printf("ESCAPED allocated %zu MiB across 8 threads\\n", total);
    return 0;
}
"""

C_DISK = """\
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
    printf("WROTE %zu MiB in %s - %s\\n", total, path, err);
    if (total >= 1024) printf("ESCAPED wrote %zu MiB into %s\\n", total, path);
    return 0;
}
"""

C_READONLY_ROOT = """\
#include <errno.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    const char *dirs[] = {"/", "/etc", "/usr/local", "/var/tmp", "/home", "/root", "/opt"};
    char p[256];
    for (unsigned i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        snprintf(p, sizeof p, "%s/labctl-selftest-write", dirs[i]);
        FILE *f = fopen(p, "w");
        if (f) { fclose(f); printf("ESCAPED wrote %s\\n", p); }
        else printf("BLOCKED write %s %s\\n", p, strerror(errno));
    }
    return 0;
}
"""

C_PLANT = f"""\
#include <stdio.h>
int main(void) {{
    const char *dirs[] = {{"/work", "/tmp", "/dev/shm", "/var/tmp", ""}};
    char p[256];
    printf("PLANTED ");
    for (unsigned i = 0; i < 5; i++) {{
        snprintf(p, sizeof p, "%s/{MARKER}", dirs[i]);
        FILE *f = fopen(p, "w");
        if (f) {{ fputs("left by an earlier run", f); fclose(f); printf("%s,", dirs[i][0] ? dirs[i] : "/"); }}
    }}
    printf("\\n");
    return 0;
}}
"""

C_FIND = f"""\
#include <stdio.h>
#include <unistd.h>
int main(void) {{
    const char *dirs[] = {{"/work", "/tmp", "/dev/shm", "/var/tmp", ""}};
    char p[256];
    for (unsigned i = 0; i < 5; i++) {{
        snprintf(p, sizeof p, "%s/{MARKER}", dirs[i]);
        if (access(p, F_OK) == 0) printf("ESCAPED found the earlier run's marker in %s\\n", p);
    }}
    printf("CHECKED /work /tmp /dev/shm /var/tmp /\\n");
    return 0;
}}
"""

C_FLOOD = """\
#include <string.h>
#include <unistd.h>
int main(void) {
    static char line[65536];
    memset(line, 'A', sizeof line);
    line[sizeof line - 1] = '\\n';
    for (int i = 0; i < 1600; i++)
        if (write({fd}, line, sizeof line) < 0) return 1;
    return 0;
}
"""

C_LINE = """\
#include <string.h>
#include <unistd.h>
int main(void) {
    static char chunk[65536];
    memset(chunk, 'B', sizeof chunk);
    for (int i = 0; i < 1600; i++)
        if (write(1, chunk, sizeof chunk) < 0) return 1;
    return 0;
}
"""

C_IGNORE_TERM = """\
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    signal(SIGTERM, SIG_IGN); signal(SIGINT, SIG_IGN); signal(SIGHUP, SIG_IGN);
    printf("IGNORING\\n"); fflush(stdout);
    for (;;) sleep(1);
}
"""

C_DOUBLE_FORK = """\
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
    printf("DETACHED\\n");
    return 0;
}
"""

C_CPU = """\
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
    printf("CPU %.3f WALL %.3f WORKERS %ld\\n", cpu, now() - start, n);
    return 0;
}
"""

C_NET_HEAD = """\
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
static void tcp(const char *host, int port) {
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET; a.sin_port = htons(port); inet_pton(AF_INET, host, &a.sin_addr);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {3, 0};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) printf("ESCAPED connected to %s:%d\\n", host, port);
    else if (errno == ECONNREFUSED) printf("ESCAPED reached %s:%d (refused: something answered)\\n", host, port);
    else printf("BLOCKED tcp %s:%d %s\\n", host, port, strerror(errno));
    close(s);
}
static void gateway(char *out, size_t n) {
    FILE *f = fopen("/proc/net/route", "r");
    char line[256], ifc[32];
    unsigned dst, gw;
    snprintf(out, n, "172.17.0.1");
    if (!f) return;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%31s %x %x", ifc, &dst, &gw) == 3 && dst == 0) {
            struct in_addr a = {gw};
            snprintf(out, n, "%s", inet_ntoa(a));
        }
    fclose(f);
}
"""

C_NET_GATEWAY = (
    C_NET_HEAD
    + """\
int main(void) {
    char gw[64];
    gateway(gw, sizeof gw);
    int ports[] = {22, 80, 2375, 2376};
    for (int i = 0; i < 4; i++) tcp(gw, ports[i]);
    return 0;
}
"""
)

C_NET_OUTSIDE = (
    C_NET_HEAD
    + """\
int main(void) { tcp("1.1.1.1", 443); tcp("8.8.8.8", 53); tcp("9.9.9.9", 80); return 0; }
"""
)

C_NET_UDP = (
    C_NET_HEAD
    + """\
int main(void) {
    char gw[64];
    gateway(gw, sizeof gw);
    const char *hosts[] = {"8.8.8.8", gw};
    const char q[] = "\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07" "example\\x03" "com\\x00\\x00\\x01\\x00\\x01";
    for (int i = 0; i < 2; i++) {
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET; a.sin_port = htons(53); inet_pton(AF_INET, hosts[i], &a.sin_addr);
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        if (sendto(s, q, sizeof q - 1, 0, (struct sockaddr *)&a, sizeof a) >= 0)
            printf("ESCAPED sent a UDP datagram to %s:53\\n", hosts[i]);
        else printf("BLOCKED udp %s:53 %s\\n", hosts[i], strerror(errno));
        close(s);
    }
    return 0;
}
"""
)

C_NET_DNS = (
    C_NET_HEAD
    + """\
int main(void) {
    const char *names[] = {"deb.debian.org", "example.com"};
    for (int i = 0; i < 2; i++) {
        struct addrinfo *res = NULL;
        int rc = getaddrinfo(names[i], "80", NULL, &res);
        if (rc == 0) { printf("ESCAPED resolved %s\\n", names[i]); freeaddrinfo(res); }
        else printf("BLOCKED dns %s %s\\n", names[i], gai_strerror(rc));
    }
    return 0;
}
"""
)

C_NET_SOCKETS = (
    C_NET_HEAD
    + """\
#include <dirent.h>
int main(void) {
    const char *paths[] = {"/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"};
    for (int i = 0; i < 3; i++) {
        struct sockaddr_un a = {0};
        a.sun_family = AF_UNIX; snprintf(a.sun_path, sizeof a.sun_path, "%s", paths[i]);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) printf("ESCAPED connected to %s\\n", paths[i]);
        else printf("BLOCKED unix %s %s\\n", paths[i], strerror(errno));
        close(s);
    }
    DIR *d = opendir("/sys/class/net");
    int others = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, "lo") != 0) { printf("ESCAPED network interface %s\\n", e->d_name); others++; }
    if (d) closedir(d);
    if (!others) printf("BLOCKED interfaces: only lo\\n");
    return 0;
}
"""
)

C_PROC = """\
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static size_t slurp(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = 0;
    for (size_t i = 0; i < got; i++) if (!buf[i]) buf[i] = ' ';
    return got;
}
int main(void) {
    char host[256] = "";
    gethostname(host, sizeof host);
    printf("HOSTNAME %s\\n", host);
    if (getuid() == 0 || geteuid() == 0) printf("ESCAPED runs as root\\n");
    const char *names[] = {"dockerd", "containerd", "containerd-shim", "sshd", "systemd", "init", "cron", "agetty"};
    DIR *d = opendir("/proc");
    struct dirent *e;
    int pids = 0, seen = 0;
    char path[512], buf[4096];
    while (d && (e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        pids++;
        snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
        if (slurp(path, buf, sizeof buf)) {
            buf[strcspn(buf, "\\n")] = 0;
            for (int i = 0; i < 8; i++)
                if (!strcmp(buf, names[i])) { printf("ESCAPED sees host process %s:%s\\n", e->d_name, buf); seen++; break; }
        }
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        if (slurp(path, buf, sizeof buf) && (strstr(buf, "SSH_") || strstr(buf, "LABCTL_HOST")))
            printf("ESCAPED read a host process's environment via %s\\n", path);
    }
    if (d) closedir(d);
    if (!seen) printf("BLOCKED proc: %d pids, none of the host's\\n", pids);
    const char *reads[] = {"/etc/shadow", "/proc/kcore", "/dev/mem", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1"};
    for (int i = 0; i < 7; i++) {
        FILE *f = fopen(reads[i], "rb");
        if (f && fread(buf, 1, 8, f) > 0) printf("ESCAPED read %s\\n", reads[i]);
        else printf("BLOCKED read %s %s\\n", reads[i], f ? "empty" : strerror(errno));
        if (f) fclose(f);
    }
    const char *writes[] = {"/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    const char *data[] = {"h", "pwned", "-1"};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(writes[i], "w");
        if (f && fputs(data[i], f) >= 0 && fclose(f) == 0) printf("ESCAPED wrote %s\\n", writes[i]);
        else printf("BLOCKED write %s %s\\n", writes[i], strerror(errno));
    }
    return 0;
}
"""

C_MOUNT = """\
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
int main(void) {
    if (mount("none", "/tmp", "tmpfs", 0, NULL) == 0) printf("ESCAPED mounted a tmpfs\\n");
    else printf("BLOCKED mount tmpfs %s\\n", strerror(errno));
    if (mount("proc", "/work", "proc", 0, NULL) == 0) printf("ESCAPED mounted proc\\n");
    else printf("BLOCKED mount proc %s\\n", strerror(errno));
    return 0;
}
"""

C_UNSHARE = """\
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    int flags[] = {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET};
    const char *names[] = {"user", "mount", "pid", "net"};
    for (int i = 0; i < 4; i++)
        if (unshare(flags[i]) == 0) printf("ESCAPED unshare %s\\n", names[i]);
        else printf("BLOCKED unshare %s %s\\n", names[i], strerror(errno));
    return 0;
}
"""

C_KEYCTL = """\
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    long r = syscall(SYS_keyctl, 1, "labctl-selftest");
    if (r >= 0) printf("ESCAPED keyctl join returned %ld\\n", r);
    else printf("BLOCKED keyctl join %s\\n", strerror(errno));
    r = syscall(SYS_add_key, "user", "labctl-selftest", "x", 1, -3);
    if (r >= 0) printf("ESCAPED add_key returned %ld\\n", r);
    else printf("BLOCKED add_key %s\\n", strerror(errno));
    return 0;
}
"""

C_PEERS = """\
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
    printf("STARTED\\n"); fflush(stdout);
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
    if (killed) printf("ESCAPED killed %d of the other run's pids\\n", killed);
    printf("SURVIVED\\n");
    return 0;
}
"""

C_INCLUDE_SHADOW = """\
#include "/etc/shadow"
int main(void) { return 0; }
"""

C_INCLUDE_HOST = """\
static const char leak[] = {
#include "/etc/hostname"
};
int main(void) { return leak[0]; }
"""

C_INCLUDE_ZERO = """\
#include "/dev/zero"
int main(void) { return 0; }
"""

C_NEIGHBOUR = """\
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
        if (pid < 0) { printf("ESCAPED the neighbour's fork bomb starved this run: %s\\n", strerror(errno)); break; }
        if (pid == 0) _exit(0);
        waitpid(pid, NULL, 0);
        ok++;
    }
    printf("FORKED %d\\nSURVIVED\\n", ok);
    return 0;
}
"""

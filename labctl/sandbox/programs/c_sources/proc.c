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
    printf("HOSTNAME %s\n", host);
    if (getuid() == 0 || geteuid() == 0) printf("ESCAPED runs as root\n");
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
            buf[strcspn(buf, "\n")] = 0;
            for (int i = 0; i < 8; i++)
                if (!strcmp(buf, names[i])) { printf("ESCAPED sees host process %s:%s\n", e->d_name, buf); seen++; break; }
        }
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        if (slurp(path, buf, sizeof buf) && (strstr(buf, "SSH_") || strstr(buf, "LABCTL_HOST")))
            printf("ESCAPED read a host process's environment via %s\n", path);
    }
    if (d) closedir(d);
    if (!seen) printf("BLOCKED proc: %d pids, none of the host's\n", pids);
    const char *reads[] = {"/etc/shadow", "/proc/kcore", "/dev/mem", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1"};
    for (int i = 0; i < 7; i++) {
        FILE *f = fopen(reads[i], "rb");
        if (f && fread(buf, 1, 8, f) > 0) printf("ESCAPED read %s\n", reads[i]);
        else printf("BLOCKED read %s %s\n", reads[i], f ? "empty" : strerror(errno));
        if (f) fclose(f);
    }
    const char *writes[] = {"/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    const char *data[] = {"h", "pwned", "-1"};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(writes[i], "w");
        if (f && fputs(data[i], f) >= 0 && fclose(f) == 0) printf("ESCAPED wrote %s\n", writes[i]);
        else printf("BLOCKED write %s %s\n", writes[i], strerror(errno));
    }
    return 0;
}

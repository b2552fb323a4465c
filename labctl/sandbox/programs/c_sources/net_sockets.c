#include <dirent.h>
int main(void) {
    const char *paths[] = {"/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"};
    for (int i = 0; i < 3; i++) {
        struct sockaddr_un a = {0};
        a.sun_family = AF_UNIX; snprintf(a.sun_path, sizeof a.sun_path, "%s", paths[i]);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) printf("ESCAPED connected to %s\n", paths[i]);
        else printf("BLOCKED unix %s %s\n", paths[i], strerror(errno));
        close(s);
    }
    DIR *d = opendir("/sys/class/net");
    int others = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, "lo") != 0) { printf("ESCAPED network interface %s\n", e->d_name); others++; }
    if (d) closedir(d);
    if (!others) printf("BLOCKED interfaces: only lo\n");
    return 0;
}

#include <stdio.h>
#include <unistd.h>
int main(void) {
    const char *dirs[] = {"/work", "/tmp", "/dev/shm", "/var/tmp", ""};
    char p[256];
    for (unsigned i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/labctl-selftest-marker", dirs[i]);
        if (access(p, F_OK) == 0) printf("ESCAPED found the earlier run's marker in %s\n", p);
    }
    printf("CHECKED /work /tmp /dev/shm /var/tmp /\n");
    return 0;
}

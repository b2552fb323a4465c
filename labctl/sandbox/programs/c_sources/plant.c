#include <stdio.h>
int main(void) {
    const char *dirs[] = {"/work", "/tmp", "/dev/shm", "/var/tmp", ""};
    char p[256];
    printf("PLANTED ");
    for (unsigned i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/labctl-selftest-marker", dirs[i]);
        FILE *f = fopen(p, "w");
        if (f) { fputs("left by an earlier run", f); fclose(f); printf("%s,", dirs[i][0] ? dirs[i] : "/"); }
    }
    printf("\n");
    return 0;
}

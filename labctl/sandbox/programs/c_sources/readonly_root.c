#include <errno.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    const char *dirs[] = {"/", "/etc", "/usr/local", "/var/tmp", "/home", "/root", "/opt"};
    char p[256];
    for (unsigned i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        snprintf(p, sizeof p, "%s/labctl-selftest-write", dirs[i]);
        FILE *f = fopen(p, "w");
        if (f) { fclose(f); printf("ESCAPED wrote %s\n", p); }
        else printf("BLOCKED write %s %s\n", p, strerror(errno));
    }
    return 0;
}

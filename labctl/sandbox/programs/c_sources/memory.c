#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    size_t mb = 0;
    while (mb < 2048) {
        char *p = malloc(16 << 20);
        if (!p) { printf("MB %zu malloc failed\n", mb); return 1; }
        memset(p, 1, 16 << 20);
        mb += 16;
        printf("MB %zu\n", mb); fflush(stdout);
    }
    printf("ESCAPED allocated %zu MiB\n", mb);
    return 0;
}

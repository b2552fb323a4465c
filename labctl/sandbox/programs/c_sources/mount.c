#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
int main(void) {
    if (mount("none", "/tmp", "tmpfs", 0, NULL) == 0) printf("ESCAPED mounted a tmpfs\n");
    else printf("BLOCKED mount tmpfs %s\n", strerror(errno));
    if (mount("proc", "/work", "proc", 0, NULL) == 0) printf("ESCAPED mounted proc\n");
    else printf("BLOCKED mount proc %s\n", strerror(errno));
    return 0;
}

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    long r = syscall(SYS_keyctl, 1, "labctl-selftest");
    if (r >= 0) printf("ESCAPED keyctl join returned %ld\n", r);
    else printf("BLOCKED keyctl join %s\n", strerror(errno));
    r = syscall(SYS_add_key, "user", "labctl-selftest", "x", 1, -3);
    if (r >= 0) printf("ESCAPED add_key returned %ld\n", r);
    else printf("BLOCKED add_key %s\n", strerror(errno));
    return 0;
}

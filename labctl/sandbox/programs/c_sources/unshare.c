#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    int flags[] = {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET};
    const char *names[] = {"user", "mount", "pid", "net"};
    for (int i = 0; i < 4; i++)
        if (unshare(flags[i]) == 0) printf("ESCAPED unshare %s\n", names[i]);
        else printf("BLOCKED unshare %s %s\n", names[i], strerror(errno));
    return 0;
}

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
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) printf("ESCAPED connected to %s:%d\n", host, port);
    else if (errno == ECONNREFUSED) printf("ESCAPED reached %s:%d (refused: something answered)\n", host, port);
    else printf("BLOCKED tcp %s:%d %s\n", host, port, strerror(errno));
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

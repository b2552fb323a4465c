int main(void) {
    const char *names[] = {"deb.debian.org", "example.com"};
    for (int i = 0; i < 2; i++) {
        struct addrinfo *res = NULL;
        int rc = getaddrinfo(names[i], "80", NULL, &res);
        if (rc == 0) { printf("ESCAPED resolved %s\n", names[i]); freeaddrinfo(res); }
        else printf("BLOCKED dns %s %s\n", names[i], gai_strerror(rc));
    }
    return 0;
}

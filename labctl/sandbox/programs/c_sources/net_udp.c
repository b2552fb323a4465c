int main(void) {
    char gw[64];
    gateway(gw, sizeof gw);
    const char *hosts[] = {"8.8.8.8", gw};
    const char q[] = "\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07" "example\x03" "com\x00\x00\x01\x00\x01";
    for (int i = 0; i < 2; i++) {
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET; a.sin_port = htons(53); inet_pton(AF_INET, hosts[i], &a.sin_addr);
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        if (sendto(s, q, sizeof q - 1, 0, (struct sockaddr *)&a, sizeof a) >= 0)
            printf("ESCAPED sent a UDP datagram to %s:53\n", hosts[i]);
        else printf("BLOCKED udp %s:53 %s\n", hosts[i], strerror(errno));
        close(s);
    }
    return 0;
}

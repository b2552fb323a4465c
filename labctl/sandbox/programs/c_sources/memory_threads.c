#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t total = 0;
static void *grab(void *arg) {
    (void)arg;
    for (int i = 0; i < 32; i++) {
        char *p = malloc(8 << 20);
        if (!p) return NULL;
        memset(p, 1, 8 << 20);
        pthread_mutex_lock(&lock);
        total += 8;
        printf("MB %zu\n", total); fflush(stdout);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}
int main(void) {
    pthread_t t[8];
    for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, grab, NULL);
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    if (total >= 2048) printf("ESCAPED allocated %zu MiB across 8 threads\n", total);
    return 0;
}

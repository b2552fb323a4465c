#include <string.h>
#include <unistd.h>
int main(void) {
    static char chunk[65536];
    memset(chunk, 'B', sizeof chunk);
    for (int i = 0; i < 1600; i++)
        if (write(1, chunk, sizeof chunk) < 0) return 1;
    return 0;
}

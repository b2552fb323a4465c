#include <string.h>
#include <unistd.h>
int main(void) {
    static char line[65536];
    memset(line, 'A', sizeof line);
    line[sizeof line - 1] = '\n';
    for (int i = 0; i < 1600; i++)
        if (write({fd}, line, sizeof line) < 0) return 1;
    return 0;
}

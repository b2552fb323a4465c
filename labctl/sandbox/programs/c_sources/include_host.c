static const char leak[] = {
#include "/etc/hostname"
};
int main(void) { return leak[0]; }

int main(void) { tcp("1.1.1.1", 443); tcp("8.8.8.8", 53); tcp("9.9.9.9", 80); return 0; }

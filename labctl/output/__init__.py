"""What a command hands its user: the console (`console`), number and time formats (`fmt`),
files written for the user (`files`: `-o`, `--out`, `--plot`, `--textfile`, run records), and
the errors every layer raises (`errors`: a message and a hint, with the exit code)."""

"""What a command hands its user: the console (`console`), number and time formats (`fmt`),
and files written for the user (`files`: `-o`, `--out`, `--plot`, `--textfile`, run records)."""

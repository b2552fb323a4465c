"""Small programming tasks with tests: what phase 3's models are asked to write.

In phase 3 a language model writes a Python program for a task, the sandbox service runs it
against the task's tests (`Task.as_program` is one entry of its batch), and the reward is the
share of tests it passes. The model sees only `prompt_text(task)`: the task's name and its
statement as comment lines, then one line asking for a program that reads stdin and prints
the answer. It never sees the tests.

The tasks come from families with a parameter or two (Caesar shift by 3 or by 13, FizzBuzz
with other divisors), so the set stays compact. Each family has a reference function from
stdin text to stdout text; every test's `expect` is that function's answer on the test's
input, never typed by hand. `solution` is a separate program, what a correct model would
write; the unit tests run it against every test, so the two cannot drift apart. Outputs are
integers, words and yes/no, never unformatted floats, so one answer is exactly right.

Standard library only, Python 3.8, and no data files: this module ships inside a zipapp.
"""

from __future__ import annotations

import math
import random
import re
import textwrap
import zlib
from collections import Counter
from dataclasses import dataclass
from itertools import groupby
from typing import Callable, Dict, List, Sequence, Tuple


@dataclass(frozen=True)
class Test:
    stdin: str
    expect: str  # the exact expected stdout, ending with "\n"


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str
    solution: str
    tests: Tuple[Test, ...]

    def as_program(self, source: str, lang: str = "python") -> Dict[str, object]:
        """`source` as one program of a sandbox batch, with this task's tests."""
        return {
            "lang": lang,
            "source": source,
            "tests": [{"stdin": t.stdin, "expect": t.expect} for t in self.tests],
        }


def prompt_text(task: Task) -> str:
    """The text a model is given for `task`."""
    body = "\n".join("# " + line for line in task.prompt.splitlines())
    return (
        f"# Task: {task.name}\n{body}\n# Write a Python 3 program that reads stdin and prints the answer.\n"
    )


# --- helpers -------------------------------------------------------------------------------


def _line(s: str) -> str:
    return s.split("\n", 1)[0]


def _ints(s: str) -> List[int]:
    return [int(x) for x in s.split()]


def _out(*lines: object) -> str:
    return "".join(f"{x}\n" for x in lines)


def _yes(b: bool) -> str:
    return "yes\n" if b else "no\n"


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _rng(name: str) -> random.Random:
    # crc32, not hash(): str hashes are salted per process, and the tests must not change.
    return random.Random(zlib.crc32(name.encode()))


def _rand_lines(name: str, count: int, n_lo: int, n_hi: int, lo: int, hi: int) -> List[str]:
    """`count` lines of random integers, each line n_lo..n_hi numbers in lo..hi."""
    rng = _rng(name)
    out = []
    for _ in range(count):
        nums = [rng.randint(lo, hi) for _ in range(rng.randint(n_lo, n_hi))]
        out.append(" ".join(map(str, nums)) + "\n")
    return out


# --- reference functions: stdin text -> stdout text ---------------------------------------


def _sum_two(s: str) -> str:
    a, b = _ints(s)
    return _out(a + b)


def _product_two(s: str) -> str:
    a, b = _ints(s)
    return _out(a * b)


def _sum_list(s: str) -> str:
    return _out(sum(_ints(s)))


def _product_list(s: str) -> str:
    p = 1
    for x in _ints(s):
        p *= x
    return _out(p)


def _reverse_string(s: str) -> str:
    return _out(_line(s)[::-1])


def _reverse_words(s: str) -> str:
    return _out(" ".join(reversed(s.split())))


def _count_vowels(s: str) -> str:
    return _out(sum(1 for c in _line(s) if c in "aeiouAEIOU"))


def _count_consonants(s: str) -> str:
    return _out(sum(1 for c in _line(s) if c.isalpha() and c not in "aeiouAEIOU"))


def _max_list(s: str) -> str:
    return _out(max(_ints(s)))


def _min_list(s: str) -> str:
    return _out(min(_ints(s)))


def _fizzbuzz(a: int, b: int) -> Callable[[str], str]:
    def f(s: str) -> str:
        out = []
        for i in range(1, int(s) + 1):
            word = ("Fizz" if i % a == 0 else "") + ("Buzz" if i % b == 0 else "")
            out.append(word or str(i))
        return _out(*out)

    return f


def _is_prime_n(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _is_prime(s: str) -> str:
    return _yes(_is_prime_n(int(s)))


def _count_primes(s: str) -> str:
    return _out(sum(1 for k in range(int(s) + 1) if _is_prime_n(k)))


def _gcd_two(s: str) -> str:
    a, b = _ints(s)
    return _out(math.gcd(a, b))


def _lcm_two(s: str) -> str:
    a, b = _ints(s)
    return _out(a * b // math.gcd(a, b) if a and b else 0)


def _factorial(s: str) -> str:
    return _out(math.factorial(int(s)))


def _trailing_zeros(s: str) -> str:
    n, z = int(s), 0
    while n:
        n //= 5
        z += n
    return _out(z)


def _fib_list_n(n: int) -> List[int]:
    out, a, b = [], 0, 1
    for _ in range(n):
        out.append(a)
        a, b = b, a + b
    return out


def _fibonacci_nth(s: str) -> str:
    return _out(_fib_list_n(int(s) + 1)[-1])


def _fibonacci_list(s: str) -> str:
    return _out(" ".join(map(str, _fib_list_n(int(s)))))


def _sort(reverse: bool) -> Callable[[str], str]:
    def f(s: str) -> str:
        return _out(" ".join(map(str, sorted(_ints(s), reverse=reverse))))

    return f


def _word_count(s: str) -> str:
    return _out(len(s.split()))


def _longest_word(s: str) -> str:
    return _out(max(s.split(), key=len))


def _palindrome(s: str) -> str:
    t = _line(s)
    return _yes(t == t[::-1])


def _palindrome_alnum(s: str) -> str:
    t = [c.lower() for c in _line(s) if c.isalnum()]
    return _yes(t == t[::-1])


def _to_binary(s: str) -> str:
    return _out(bin(int(s))[2:])


def _from_binary(s: str) -> str:
    return _out(int(s.strip(), 2))


def _c_to_f(s: str) -> str:
    return _out(int(s) * 9 // 5 + 32)


def _f_to_c(s: str) -> str:
    return _out((int(s) - 32) * 5 // 9)


def _caesar(k: int) -> Callable[[str], str]:
    def f(s: str) -> str:
        out = []
        for c in _line(s):
            if "a" <= c <= "z":
                c = chr((ord(c) - 97 + k) % 26 + 97)
            elif "A" <= c <= "Z":
                c = chr((ord(c) - 65 + k) % 26 + 65)
            out.append(c)
        return _out("".join(out))

    return f


def _rle_encode(s: str) -> str:
    return _out("".join(c + str(len(list(g))) for c, g in groupby(_line(s))))


def _rle_decode(s: str) -> str:
    return _out("".join(c * int(n) for c, n in re.findall(r"([a-z])(\d+)", s)))


def _digit_sum(s: str) -> str:
    return _out(sum(int(c) for c in str(abs(int(s)))))


def _digital_root(s: str) -> str:
    n = int(s)
    while n >= 10:
        n = sum(int(c) for c in str(n))
    return _out(n)


def _anagram(s: str) -> str:
    a, b = s.split()
    return _yes(sorted(a) == sorted(b))


def _rotation(s: str) -> str:
    a, b = s.split()
    return _yes(len(a) == len(b) and b in a + a)


def _upper_case(s: str) -> str:
    return _out(_line(s).upper())


def _title_case(s: str) -> str:
    return _out(" ".join(w[:1].upper() + w[1:].lower() for w in s.split()))


def _distinct_words(s: str) -> str:
    return _out(len(set(s.split())))


def _most_common_word(s: str) -> str:
    counts = Counter(s.split())
    return _out(min(counts, key=lambda w: (-counts[w], w)))


def _second(largest: bool) -> Callable[[str], str]:
    def f(s: str) -> str:
        vals = sorted(set(_ints(s)), reverse=largest)
        return _out(vals[1] if len(vals) >= 2 else "none")

    return f


def _matrix(s: str) -> List[List[int]]:
    lines = s.splitlines()
    r = int(lines[0].split()[0])
    return [_ints(line) for line in lines[1 : r + 1]]


def _row_sums(s: str) -> str:
    return _out(*(sum(row) for row in _matrix(s)))


def _col_sums(s: str) -> str:
    m = _matrix(s)
    return _out(" ".join(str(sum(row[j] for row in m)) for j in range(len(m[0]))))


def _balanced(s: str) -> str:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: List[str] = []
    for c in _line(s):
        if c in "([{":
            stack.append(c)
        elif not stack or stack.pop() != pairs[c]:
            return _yes(False)
    return _yes(not stack)


def _paren_depth(s: str) -> str:
    depth = best = 0
    for c in _line(s):
        depth += 1 if c == "(" else -1
        best = max(best, depth)
    return _out(best)


def _leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def _leap_year(s: str) -> str:
    return _yes(_leap(int(s)))


def _days_in_month(s: str) -> str:
    y, m = _ints(s)
    return _out(29 if m == 2 and _leap(y) else [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m - 1])


def _collatz(n: int) -> List[int]:
    seq = [n]
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        seq.append(n)
    return seq


def _collatz_steps(s: str) -> str:
    return _out(len(_collatz(int(s))) - 1)


def _collatz_max(s: str) -> str:
    return _out(max(_collatz(int(s))))


def _power_mod(s: str) -> str:
    a, b, m = _ints(s)
    return _out(pow(a, b, m))


def _int_sqrt(s: str) -> str:
    return _out(math.isqrt(int(s)))


def _count_char(s: str) -> str:
    c, text = s.split("\n")[:2]
    return _out(text.count(c))


def _dedupe_chars(s: str) -> str:
    seen: List[str] = []
    for c in _line(s):
        if c not in seen:
            seen.append(c)
    return _out("".join(seen))


# --- the tasks -------------------------------------------------------------------------------


def _t(name: str, prompt: str, ref: Callable[[str], str], solution: str, inputs: Sequence[str]) -> Task:
    return Task(name, prompt, _src(solution), tuple(Test(i, ref(i)) for i in inputs))


_READ_INTS = "Read a line of space-separated integers"

_FIZZ_SOLUTION = """
    n = int(input())
    for i in range(1, n + 1):
        word = ("Fizz" if i % A == 0 else "") + ("Buzz" if i % B == 0 else "")
        print(word or i)
"""

_CAESAR_SOLUTION = """
    out = []
    for c in input():
        if c.islower():
            c = chr((ord(c) - 97 + K) % 26 + 97)
        elif c.isupper():
            c = chr((ord(c) - 65 + K) % 26 + 65)
        out.append(c)
    print("".join(out))
"""

_SECOND_SOLUTION = """
    vals = sorted(set(map(int, input().split())), reverse=LARGEST)
    print(vals[1] if len(vals) >= 2 else "none")
"""

_SORT_SOLUTION = """
    print(" ".join(map(str, sorted(map(int, input().split()), reverse=REVERSE))))
"""


def _build() -> Tuple[Task, ...]:
    t: List[Task] = []
    # Arithmetic on two integers.
    two_ints = ["2 3\n", "0 0\n", "-4 7\n", "-5 -6\n", "123456 654321\n", "1 -1\n", "99999 0\n"]
    t.append(
        _t(
            "sum_two",
            "Read two integers a and b on one line and print a + b.",
            _sum_two,
            "a, b = map(int, input().split())\nprint(a + b)\n",
            two_ints,
        )
    )
    t.append(
        _t(
            "product_two",
            "Read two integers a and b on one line and print a * b.",
            _product_two,
            "a, b = map(int, input().split())\nprint(a * b)\n",
            two_ints,
        )
    )
    # Aggregates of a list.
    lists = ["1 2 3 4\n", "\n", "7\n", "-3 3 -2\n", "0 5 0\n", *_rand_lines("lists", 2, 3, 9, -20, 20)]
    t.append(
        _t(
            "sum_list",
            f"{_READ_INTS} (the line may be empty) and print their sum.",
            _sum_list,
            "print(sum(map(int, input().split())))\n",
            lists,
        )
    )
    t.append(
        _t(
            "product_list",
            f"{_READ_INTS} (the line may be empty) and print their product; the product of no numbers is 1.",
            _product_list,
            """
            p = 1
            for x in input().split():
                p *= int(x)
            print(p)
            """,
            lists,
        )
    )
    # Strings: reverse.
    t.append(
        _t(
            "reverse_string",
            "Read one line of text and print its characters in reverse order.",
            _reverse_string,
            "print(input()[::-1])\n",
            ["hello\n", "a\n", "racecar\n", "Hello, World!\n", "ab cd\n", "12345\n"],
        )
    )
    t.append(
        _t(
            "reverse_words",
            "Read one line of words separated by spaces and print the words in reverse order, separated by single spaces.",
            _reverse_words,
            'print(" ".join(reversed(input().split())))\n',
            [
                "one two three\n",
                "solo\n",
                "a b\n",
                "the quick brown fox jumps\n",
                "x  y   z\n",
                "1 2 3 4 5 6\n",
            ],
        )
    )
    # Strings: vowels and consonants.
    letters = [
        "hello\n",
        "AEIOU aeiou\n",
        "rhythm\n",
        "Programming in Python\n",
        "xyz!\n",
        "a\n",
        "Queue 42\n",
    ]
    t.append(
        _t(
            "count_vowels",
            "Read one line of text and print how many of its characters are vowels (a, e, i, o, u, in either case).",
            _count_vowels,
            'print(sum(1 for c in input() if c in "aeiouAEIOU"))\n',
            letters,
        )
    )
    t.append(
        _t(
            "count_consonants",
            "Read one line of text and print how many of its characters are letters other than a, e, i, o, u (in either case).",
            _count_consonants,
            'print(sum(1 for c in input() if c.isalpha() and c not in "aeiouAEIOU"))\n',
            letters,
        )
    )
    # Extremes of a list.
    nonempty = [
        "3 1 2\n",
        "5\n",
        "-1 -7 -3\n",
        "0 0 0\n",
        "10 -10\n",
        *_rand_lines("extremes", 2, 2, 10, -99, 99),
    ]
    t.append(
        _t(
            "max_list",
            f"{_READ_INTS} (at least one) and print the largest.",
            _max_list,
            "print(max(map(int, input().split())))\n",
            nonempty,
        )
    )
    t.append(
        _t(
            "min_list",
            f"{_READ_INTS} (at least one) and print the smallest.",
            _min_list,
            "print(min(map(int, input().split())))\n",
            nonempty,
        )
    )
    # FizzBuzz, with the classic divisors and with others.
    for name, a, b in (("fizzbuzz", 3, 5), ("fizzbuzz_2_7", 2, 7)):
        t.append(
            _t(
                name,
                f"Read an integer n >= 1 and print the numbers 1 to n, one per line, but print Fizz for multiples of {a}, "
                f"Buzz for multiples of {b}, and FizzBuzz for multiples of both.",
                _fizzbuzz(a, b),
                f"A = {a}\nB = {b}\n" + _src(_FIZZ_SOLUTION),
                ["1\n", "2\n", "5\n", "15\n", "16\n", "30\n"],
            )
        )
    # Primes.
    t.append(
        _t(
            "is_prime",
            "Read an integer n and print yes if n is a prime number, otherwise no.",
            _is_prime,
            """
            n = int(input())
            print("yes" if n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1)) else "no")
            """,
            ["2\n", "1\n", "0\n", "-7\n", "97\n", "91\n", "7919\n", "1000000\n"],
        )
    )
    t.append(
        _t(
            "count_primes",
            "Read an integer n >= 0 and print how many prime numbers are less than or equal to n.",
            _count_primes,
            """
            n = int(input())
            print(sum(1 for k in range(2, n + 1) if all(k % d for d in range(2, int(k ** 0.5) + 1))))
            """,
            ["0\n", "1\n", "2\n", "10\n", "100\n", "1000\n"],
        )
    )
    # GCD and LCM.
    pairs = ["12 18\n", "7 13\n", "0 5\n", "0 0\n", "100 75\n", "1 1\n", "48 180\n"]
    t.append(
        _t(
            "gcd_two",
            "Read two non-negative integers a and b on one line and print their greatest common divisor (gcd(0, 0) is 0).",
            _gcd_two,
            "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))\n",
            pairs,
        )
    )
    t.append(
        _t(
            "lcm_two",
            "Read two non-negative integers a and b on one line and print their least common multiple (0 if either is 0).",
            _lcm_two,
            "import math\na, b = map(int, input().split())\nprint(a * b // math.gcd(a, b) if a and b else 0)\n",
            pairs,
        )
    )
    # Factorials.
    t.append(
        _t(
            "factorial",
            "Read an integer n (0 <= n <= 30) and print n! (the product 1 * 2 * ... * n; 0! is 1).",
            _factorial,
            "import math\nprint(math.factorial(int(input())))\n",
            ["0\n", "1\n", "5\n", "10\n", "20\n", "30\n"],
        )
    )
    t.append(
        _t(
            "trailing_zeros",
            "Read an integer n >= 0 and print how many zeros n! ends with in decimal.",
            _trailing_zeros,
            """
            n = int(input())
            z = 0
            while n:
                n //= 5
                z += n
            print(z)
            """,
            ["0\n", "4\n", "5\n", "25\n", "100\n", "1000000000\n"],
        )
    )
    # Fibonacci.
    t.append(
        _t(
            "fibonacci_nth",
            "Read an integer n (0 <= n <= 90) and print the n-th Fibonacci number, where F(0) = 0 and F(1) = 1.",
            _fibonacci_nth,
            """
            n = int(input())
            a, b = 0, 1
            for _ in range(n):
                a, b = b, a + b
            print(a)
            """,
            ["0\n", "1\n", "2\n", "10\n", "50\n", "90\n"],
        )
    )
    t.append(
        _t(
            "fibonacci_list",
            "Read an integer n >= 1 and print the first n Fibonacci numbers (starting 0 1 1 2) on one line, separated by spaces.",
            _fibonacci_list,
            """
            n = int(input())
            out, a, b = [], 0, 1
            for _ in range(n):
                out.append(a)
                a, b = b, a + b
            print(" ".join(map(str, out)))
            """,
            ["1\n", "2\n", "3\n", "8\n", "20\n"],
        )
    )
    # Sorting.
    sortable = ["3 1 2\n", "\n", "5\n", "-2 7 -2 0\n", "9 8 7 6 5\n", *_rand_lines("sort", 2, 4, 12, -50, 50)]
    for name, rev, order in (("sort_asc", False, "ascending"), ("sort_desc", True, "descending")):
        t.append(
            _t(
                name,
                f"{_READ_INTS} (the line may be empty) and print them in {order} order, separated by spaces.",
                _sort(rev),
                f"REVERSE = {rev}\n" + _src(_SORT_SOLUTION),
                sortable,
            )
        )
    # Words.
    t.append(
        _t(
            "word_count",
            "Read one line of text and print how many words it has (words are separated by one or more spaces).",
            _word_count,
            "print(len(input().split()))\n",
            ["hello world\n", "\n", "one\n", "  lots   of   space  \n", "a b c d e f g\n", "end.\n"],
        )
    )
    t.append(
        _t(
            "longest_word",
            "Read one line of words separated by spaces and print the longest word; if several are longest, print the first.",
            _longest_word,
            "print(max(input().split(), key=len))\n",
            ["the quick brown fox\n", "a\n", "ab cd ef\n", "short longer longest\n", "xx yyy zzz w\n"],
        )
    )
    # Palindromes.
    t.append(
        _t(
            "palindrome",
            "Read one line of text and print yes if it reads the same backwards (exactly, character by character), otherwise no.",
            _palindrome,
            's = input()\nprint("yes" if s == s[::-1] else "no")\n',
            ["racecar\n", "hello\n", "a\n", "abba\n", "Abba\n", "ab a\n", "12321\n"],
        )
    )
    t.append(
        _t(
            "palindrome_alnum",
            "Read one line of text and print yes if its letters and digits, ignoring case and everything else, "
            "read the same backwards, otherwise no.",
            _palindrome_alnum,
            """
            s = [c.lower() for c in input() if c.isalnum()]
            print("yes" if s == s[::-1] else "no")
            """,
            [
                "A man, a plan, a canal: Panama\n",
                "hello\n",
                "No 'x' in Nixon\n",
                "ab\n",
                "!!\n",
                "Was it a car?\n",
            ],
        )
    )
    # Binary.
    t.append(
        _t(
            "to_binary",
            "Read an integer n >= 0 and print it in binary, without leading zeros or a prefix (0 prints 0).",
            _to_binary,
            "print(bin(int(input()))[2:])\n",
            ["0\n", "1\n", "2\n", "5\n", "255\n", "1024\n"],
        )
    )
    t.append(
        _t(
            "from_binary",
            "Read a binary number (digits 0 and 1) on one line and print its value in decimal.",
            _from_binary,
            "print(int(input(), 2))\n",
            ["0\n", "1\n", "101\n", "11111111\n", "0010\n", "10000000000\n"],
        )
    )
    # Temperatures, in integer arithmetic.
    t.append(
        _t(
            "c_to_f",
            "Read a temperature in Celsius as an integer c and print c * 9 / 5 + 32 rounded down to an integer.",
            _c_to_f,
            "print(int(input()) * 9 // 5 + 32)\n",
            ["0\n", "100\n", "-40\n", "37\n", "-1\n", "21\n"],
        )
    )
    t.append(
        _t(
            "f_to_c",
            "Read a temperature in Fahrenheit as an integer f and print (f - 32) * 5 / 9 rounded down to an integer.",
            _f_to_c,
            "print((int(input()) - 32) * 5 // 9)\n",
            ["32\n", "212\n", "-40\n", "100\n", "0\n", "33\n"],
        )
    )
    # Caesar cipher.
    for k in (3, 13):
        t.append(
            _t(
                f"caesar_{k}",
                f"Read one line of text and print it with every letter shifted {k} places forward in the alphabet, "
                "wrapping from z to a and keeping its case; other characters stay as they are.",
                _caesar(k),
                f"K = {k}\n" + _src(_CAESAR_SOLUTION),
                ["abc\n", "xyz\n", "Hello, World!\n", "ZEBRA zebra\n", "123 go\n", "The quick brown fox\n"],
            )
        )
    # Run-length encoding.
    t.append(
        _t(
            "rle_encode",
            "Read a line of lowercase letters and print its run-length encoding: each run of equal letters "
            "as the letter followed by the run's length (aaabcc prints a3b1c2).",
            _rle_encode,
            """
            from itertools import groupby
            print("".join(c + str(len(list(g))) for c, g in groupby(input())))
            """,
            ["aaabcc\n", "a\n", "abc\n", "zzzzzzzzzzzz\n", "aabbaa\n", "\n"],
        )
    )
    t.append(
        _t(
            "rle_decode",
            "Read a run-length encoded line, letters each followed by a count (a3b1c2), and print the decoded text (aaabcc).",
            _rle_decode,
            """
            import re
            print("".join(c * int(n) for c, n in re.findall(r"([a-z])(\\d+)", input())))
            """,
            ["a3b1c2\n", "x1\n", "z12\n", "a1b1c1\n", "q10w2\n"],
        )
    )
    # Digits.
    t.append(
        _t(
            "digit_sum",
            "Read an integer n (possibly negative) and print the sum of its decimal digits.",
            _digit_sum,
            "print(sum(int(c) for c in str(abs(int(input())))))\n",
            ["0\n", "7\n", "123\n", "-456\n", "99999\n", "1000001\n"],
        )
    )
    t.append(
        _t(
            "digital_root",
            "Read an integer n >= 0 and replace it with the sum of its digits until it has one digit; print that digit.",
            _digital_root,
            """
            n = int(input())
            while n >= 10:
                n = sum(int(c) for c in str(n))
            print(n)
            """,
            ["0\n", "9\n", "38\n", "12345\n", "99999999\n", "10\n"],
        )
    )
    # Pairs of words.
    t.append(
        _t(
            "anagram",
            "Read two words on one line and print yes if one is an anagram of the other (same letters, same counts), otherwise no.",
            _anagram,
            'a, b = input().split()\nprint("yes" if sorted(a) == sorted(b) else "no")\n',
            ["listen silent\n", "abc abd\n", "a a\n", "aab abb\n", "evil vile\n", "ab abc\n"],
        )
    )
    t.append(
        _t(
            "rotation",
            "Read two words a and b on one line and print yes if b is a rotation of a (abcde and cdeab are), otherwise no.",
            _rotation,
            'a, b = input().split()\nprint("yes" if len(a) == len(b) and b in a + a else "no")\n',
            [
                "abcde cdeab\n",
                "abcde abced\n",
                "a a\n",
                "ab ba\n",
                "abc abcabc\n",
                "waterbottle erbottlewat\n",
            ],
        )
    )
    # Case.
    t.append(
        _t(
            "upper_case",
            "Read one line of text and print it with every letter in upper case.",
            _upper_case,
            "print(input().upper())\n",
            ["hello\n", "Hello, World!\n", "ALREADY\n", "mIxEd 123\n", "x\n"],
        )
    )
    t.append(
        _t(
            "title_case",
            "Read one line of words separated by spaces and print the words separated by single spaces, "
            "each with its first character in upper case and the rest in lower case.",
            _title_case,
            'print(" ".join(w[:1].upper() + w[1:].lower() for w in input().split()))\n',
            ["hello world\n", "HELLO WORLD\n", "a\n", "mIxEd   cAsE words\n", "it's 3rd time\n"],
        )
    )
    # Counting words.
    t.append(
        _t(
            "distinct_words",
            "Read one line of words separated by spaces and print how many different words it has (case-sensitive).",
            _distinct_words,
            "print(len(set(input().split())))\n",
            ["a b a\n", "\n", "one\n", "to be or not to be\n", "A a A a\n", "x y z x y z\n"],
        )
    )
    t.append(
        _t(
            "most_common_word",
            "Read one line of words separated by spaces and print the word that occurs most often; "
            "among equally frequent words, print the alphabetically smallest.",
            _most_common_word,
            """
            from collections import Counter
            c = Counter(input().split())
            print(min(c, key=lambda w: (-c[w], w)))
            """,
            [
                "a b a\n",
                "one\n",
                "to be or not to be\n",
                "b a\n",
                "x y y z z\n",
                "the cat and the hat and the bat\n",
            ],
        )
    )
    # Second extremes.
    seconds = ["3 1 2\n", "5\n", "4 4 4\n", "-1 -2\n", "7 7 3 3\n", *_rand_lines("second", 2, 3, 10, -30, 30)]
    for name, largest in (("second_largest", True), ("second_smallest", False)):
        which = "largest" if largest else "smallest"
        t.append(
            _t(
                name,
                f"{_READ_INTS} and print the second {which} distinct value, or none if there are fewer than two distinct values.",
                _second(largest),
                f"LARGEST = {largest}\n" + _src(_SECOND_SOLUTION),
                seconds,
            )
        )
    # Matrices.
    matrices = [
        "2 3\n1 2 3\n4 5 6\n",
        "1 1\n-5\n",
        "3 2\n1 -1\n0 0\n10 20\n",
        "1 4\n1 2 3 4\n",
        "4 1\n7\n8\n9\n10\n",
        "2 2\n0 0\n0 0\n",
    ]
    t.append(
        _t(
            "row_sums",
            "Read r and c on the first line, then r lines of c integers each; print the sum of each row, one per line.",
            _row_sums,
            """
            r, c = map(int, input().split())
            for _ in range(r):
                print(sum(map(int, input().split())))
            """,
            matrices,
        )
    )
    t.append(
        _t(
            "col_sums",
            "Read r and c on the first line, then r lines of c integers each; print the c column sums on one line, separated by spaces.",
            _col_sums,
            """
            r, c = map(int, input().split())
            rows = [list(map(int, input().split())) for _ in range(r)]
            print(" ".join(str(sum(col)) for col in zip(*rows)))
            """,
            matrices,
        )
    )
    # Brackets.
    t.append(
        _t(
            "balanced_brackets",
            "Read a line made only of the characters ()[]{} (possibly empty) and print yes if the brackets are balanced "
            "and properly nested, otherwise no.",
            _balanced,
            """
            pairs = {")": "(", "]": "[", "}": "{"}
            stack = []
            ok = True
            for c in input():
                if c in "([{":
                    stack.append(c)
                elif not stack or stack.pop() != pairs[c]:
                    ok = False
                    break
            print("yes" if ok and not stack else "no")
            """,
            ["()[]{}\n", "([{}])\n", "(]\n", "((\n", "\n", "())(\n", "{[()()]}\n", "]\n"],
        )
    )
    t.append(
        _t(
            "paren_depth",
            "Read a line of balanced parentheses ( and ) (possibly empty) and print the deepest nesting depth.",
            _paren_depth,
            """
            depth = best = 0
            for c in input():
                depth += 1 if c == "(" else -1
                best = max(best, depth)
            print(best)
            """,
            ["()\n", "\n", "(())()\n", "((()))\n", "()()()\n", "(()(()))\n"],
        )
    )
    # Calendar.
    t.append(
        _t(
            "leap_year",
            "Read a year and print yes if it is a leap year in the Gregorian calendar, otherwise no.",
            _leap_year,
            """
            y = int(input())
            print("yes" if y % 4 == 0 and (y % 100 != 0 or y % 400 == 0) else "no")
            """,
            ["2000\n", "1900\n", "2024\n", "2023\n", "2400\n", "4\n"],
        )
    )
    t.append(
        _t(
            "days_in_month",
            "Read a year and a month (1 to 12) on one line and print how many days that month has in the Gregorian calendar.",
            _days_in_month,
            """
            y, m = map(int, input().split())
            leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
            days = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
            print(days[m - 1])
            """,
            ["2023 1\n", "2023 2\n", "2024 2\n", "1900 2\n", "2000 2\n", "2023 4\n", "2023 12\n"],
        )
    )
    # Collatz.
    collatz_in = ["1\n", "2\n", "3\n", "6\n", "27\n", "97\n"]
    t.append(
        _t(
            "collatz_steps",
            "Read an integer n >= 1. Repeatedly halve it if even or replace it with 3n + 1 if odd; "
            "print how many steps it takes to reach 1.",
            _collatz_steps,
            """
            n = int(input())
            steps = 0
            while n != 1:
                n = n // 2 if n % 2 == 0 else 3 * n + 1
                steps += 1
            print(steps)
            """,
            collatz_in,
        )
    )
    t.append(
        _t(
            "collatz_max",
            "Read an integer n >= 1. Repeatedly halve it if even or replace it with 3n + 1 if odd, until it is 1; "
            "print the largest value reached (n included).",
            _collatz_max,
            """
            n = int(input())
            best = n
            while n != 1:
                n = n // 2 if n % 2 == 0 else 3 * n + 1
                best = max(best, n)
            print(best)
            """,
            collatz_in,
        )
    )
    # Number theory.
    t.append(
        _t(
            "power_mod",
            "Read three integers a, b, m on one line (a, b >= 0, m >= 1) and print a to the power b, modulo m.",
            _power_mod,
            "a, b, m = map(int, input().split())\nprint(pow(a, b, m))\n",
            ["2 10 1000\n", "3 0 7\n", "0 0 5\n", "5 3 1\n", "7 123456789 1000000007\n", "10 2 7\n"],
        )
    )
    t.append(
        _t(
            "int_sqrt",
            "Read an integer n >= 0 and print the largest integer whose square is at most n.",
            _int_sqrt,
            """
            n = int(input())
            r = int(n ** 0.5)
            while r * r > n:
                r -= 1
            while (r + 1) * (r + 1) <= n:
                r += 1
            print(r)
            """,
            ["0\n", "1\n", "15\n", "16\n", "17\n", "999999999999\n", "10000000000000000\n"],
        )
    )
    # Characters.
    t.append(
        _t(
            "count_char",
            "Read a single character on the first line and a line of text on the second; "
            "print how many times the character occurs in the text (case-sensitive).",
            _count_char,
            "c = input()\nprint(input().count(c))\n",
            ["a\nbanana\n", "z\nbanana\n", "A\naAaA\n", "!\nhi! hello!!\n", "x\n\n", "1\n101101\n"],
        )
    )
    t.append(
        _t(
            "dedupe_chars",
            "Read one line of text and print it keeping only the first occurrence of each character.",
            _dedupe_chars,
            """
            seen = []
            for c in input():
                if c not in seen:
                    seen.append(c)
            print("".join(seen))
            """,
            ["banana\n", "abc\n", "aaaa\n", "hello world\n", "AaBbAa\n", "\n"],
        )
    )
    return tuple(t)


TASKS: Tuple[Task, ...] = _build()
_BY_NAME: Dict[str, Task] = {x.name: x for x in TASKS}


def task(name: str) -> Task:
    """The task called `name`; KeyError naming it if there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no task named {name!r} (there are {len(TASKS)}, e.g. {TASKS[0].name!r})") from None

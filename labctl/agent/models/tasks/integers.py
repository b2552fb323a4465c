"""Task families whose input is one integer or a few on a line: arithmetic, FizzBuzz, primes,
gcd and lcm, factorials, Fibonacci, binary, temperatures, digits, calendar, Collatz, powers
and roots.

Each family is a function returning its tasks, with its reference functions just above it;
the package's `__init__` puts the families in order.
"""

from __future__ import annotations

import math
from typing import Callable, List

from .base import Task, _ints, _out, _src, _t, _yes


def _sum_two(s: str) -> str:
    a, b = _ints(s)
    return _out(a + b)


def _product_two(s: str) -> str:
    a, b = _ints(s)
    return _out(a * b)


def arithmetic() -> List[Task]:
    """Arithmetic on two integers: sum_two, product_two."""
    t: List[Task] = []
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
    return t


def _fizzbuzz(a: int, b: int) -> Callable[[str], str]:
    def f(s: str) -> str:
        out = []
        for i in range(1, int(s) + 1):
            word = ("Fizz" if i % a == 0 else "") + ("Buzz" if i % b == 0 else "")
            out.append(word or str(i))
        return _out(*out)

    return f


_FIZZ_SOLUTION = """
    n = int(input())
    for i in range(1, n + 1):
        word = ("Fizz" if i % A == 0 else "") + ("Buzz" if i % B == 0 else "")
        print(word or i)
"""


def fizzbuzz() -> List[Task]:
    """FizzBuzz, with the classic divisors and with others: fizzbuzz, fizzbuzz_2_7."""
    t: List[Task] = []
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
    return t


def _is_prime_n(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _is_prime(s: str) -> str:
    return _yes(_is_prime_n(int(s)))


def _count_primes(s: str) -> str:
    return _out(sum(1 for k in range(int(s) + 1) if _is_prime_n(k)))


def primes() -> List[Task]:
    """Primes: is_prime, count_primes."""
    t: List[Task] = []
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
    return t


def _gcd_two(s: str) -> str:
    a, b = _ints(s)
    return _out(math.gcd(a, b))


def _lcm_two(s: str) -> str:
    a, b = _ints(s)
    return _out(a * b // math.gcd(a, b) if a and b else 0)


def gcd_lcm() -> List[Task]:
    """GCD and LCM: gcd_two, lcm_two."""
    t: List[Task] = []
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
    return t


def _factorial(s: str) -> str:
    return _out(math.factorial(int(s)))


def _trailing_zeros(s: str) -> str:
    n, z = int(s), 0
    while n:
        n //= 5
        z += n
    return _out(z)


def factorials() -> List[Task]:
    """Factorials: factorial, trailing_zeros."""
    t: List[Task] = []
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
    return t


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


def fibonacci() -> List[Task]:
    """Fibonacci: fibonacci_nth, fibonacci_list."""
    t: List[Task] = []
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
    return t


def _to_binary(s: str) -> str:
    return _out(bin(int(s))[2:])


def _from_binary(s: str) -> str:
    return _out(int(s.strip(), 2))


def binary() -> List[Task]:
    """Binary: to_binary, from_binary."""
    t: List[Task] = []
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
    return t


def _c_to_f(s: str) -> str:
    return _out(int(s) * 9 // 5 + 32)


def _f_to_c(s: str) -> str:
    return _out((int(s) - 32) * 5 // 9)


def temperatures() -> List[Task]:
    """Temperatures, in integer arithmetic: c_to_f, f_to_c."""
    t: List[Task] = []
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
    return t


def _digit_sum(s: str) -> str:
    return _out(sum(int(c) for c in str(abs(int(s)))))


def _digital_root(s: str) -> str:
    n = int(s)
    while n >= 10:
        n = sum(int(c) for c in str(n))
    return _out(n)


def digits() -> List[Task]:
    """Digits: digit_sum, digital_root."""
    t: List[Task] = []
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
    return t


def _leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def _leap_year(s: str) -> str:
    return _yes(_leap(int(s)))


def _days_in_month(s: str) -> str:
    y, m = _ints(s)
    return _out(29 if m == 2 and _leap(y) else [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m - 1])


def calendar() -> List[Task]:
    """Calendar: leap_year, days_in_month."""
    t: List[Task] = []
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
    return t


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


def collatz() -> List[Task]:
    """Collatz: collatz_steps, collatz_max."""
    t: List[Task] = []
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
    return t


def _power_mod(s: str) -> str:
    a, b, m = _ints(s)
    return _out(pow(a, b, m))


def _int_sqrt(s: str) -> str:
    return _out(math.isqrt(int(s)))


def number_theory() -> List[Task]:
    """Powers and roots: power_mod, int_sqrt."""
    t: List[Task] = []
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
    return t

"""Task families whose input is a line of integers, or a grid of them: sums and products,
extremes, sorting, second extremes, row and column sums.

Each family is a function returning its tasks, with its reference functions just above it;
the package's `__init__` puts the families in order. The random inputs of the set are all
lists, so they are drawn here.
"""

from __future__ import annotations

import random
import zlib
from typing import Callable, List

from .base import Task, _ints, _out, _src, _t

_READ_INTS = "Read a line of space-separated integers"


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


def _sum_list(s: str) -> str:
    return _out(sum(_ints(s)))


def _product_list(s: str) -> str:
    p = 1
    for x in _ints(s):
        p *= x
    return _out(p)


def aggregates() -> List[Task]:
    """Aggregates of a list: sum_list, product_list."""
    t: List[Task] = []
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
    return t


def _max_list(s: str) -> str:
    return _out(max(_ints(s)))


def _min_list(s: str) -> str:
    return _out(min(_ints(s)))


def extremes() -> List[Task]:
    """Extremes of a list: max_list, min_list."""
    t: List[Task] = []
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
    return t


def _sort(reverse: bool) -> Callable[[str], str]:
    def f(s: str) -> str:
        return _out(" ".join(map(str, sorted(_ints(s), reverse=reverse))))

    return f


_SORT_SOLUTION = """
    print(" ".join(map(str, sorted(map(int, input().split()), reverse=REVERSE))))
"""


def sorting() -> List[Task]:
    """Sorting: sort_asc, sort_desc."""
    t: List[Task] = []
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
    return t


def _second(largest: bool) -> Callable[[str], str]:
    def f(s: str) -> str:
        vals = sorted(set(_ints(s)), reverse=largest)
        return _out(vals[1] if len(vals) >= 2 else "none")

    return f


_SECOND_SOLUTION = """
    vals = sorted(set(map(int, input().split())), reverse=LARGEST)
    print(vals[1] if len(vals) >= 2 else "none")
"""


def second_extremes() -> List[Task]:
    """Second extremes: second_largest, second_smallest."""
    t: List[Task] = []
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
    return t


def _matrix(s: str) -> List[List[int]]:
    lines = s.splitlines()
    r = int(lines[0].split()[0])
    return [_ints(line) for line in lines[1 : r + 1]]


def _row_sums(s: str) -> str:
    return _out(*(sum(row) for row in _matrix(s)))


def _col_sums(s: str) -> str:
    m = _matrix(s)
    return _out(" ".join(str(sum(row[j] for row in m)) for j in range(len(m[0]))))


def matrices() -> List[Task]:
    """Matrices: row_sums, col_sums."""
    t: List[Task] = []
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
    return t

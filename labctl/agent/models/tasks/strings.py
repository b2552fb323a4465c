"""Task families whose input is text: reversal, vowels, words, palindromes, Caesar cipher,
run-length codes, pairs of words, case, word counts, brackets, characters.

Each family is a function returning its tasks, with its reference functions just above it;
the package's `__init__` puts the families in order.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import groupby
from typing import Callable, List

from .base import Task, _line, _out, _src, _t, _yes


def _reverse_string(s: str) -> str:
    return _out(_line(s)[::-1])


def _reverse_words(s: str) -> str:
    return _out(" ".join(reversed(s.split())))


def reverse() -> List[Task]:
    """Reversal: reverse_string, reverse_words."""
    t: List[Task] = []
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
    return t


def _count_vowels(s: str) -> str:
    return _out(sum(1 for c in _line(s) if c in "aeiouAEIOU"))


def _count_consonants(s: str) -> str:
    return _out(sum(1 for c in _line(s) if c.isalpha() and c not in "aeiouAEIOU"))


def vowels() -> List[Task]:
    """Letters by kind: count_vowels, count_consonants."""
    t: List[Task] = []
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
    return t


def _word_count(s: str) -> str:
    return _out(len(s.split()))


def _longest_word(s: str) -> str:
    return _out(max(s.split(), key=len))


def words() -> List[Task]:
    """Words of a line: word_count, longest_word."""
    t: List[Task] = []
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
    return t


def _palindrome(s: str) -> str:
    t = _line(s)
    return _yes(t == t[::-1])


def _palindrome_alnum(s: str) -> str:
    t = [c.lower() for c in _line(s) if c.isalnum()]
    return _yes(t == t[::-1])


def palindromes() -> List[Task]:
    """Palindromes: palindrome, palindrome_alnum."""
    t: List[Task] = []
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
    return t


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


def caesar() -> List[Task]:
    """Caesar cipher: caesar_3, caesar_13."""
    t: List[Task] = []
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
    return t


def _rle_encode(s: str) -> str:
    return _out("".join(c + str(len(list(g))) for c, g in groupby(_line(s))))


def _rle_decode(s: str) -> str:
    return _out("".join(c * int(n) for c, n in re.findall(r"([a-z])(\d+)", s)))


def run_length() -> List[Task]:
    """Run-length encoding: rle_encode, rle_decode."""
    t: List[Task] = []
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
    return t


def _anagram(s: str) -> str:
    a, b = s.split()
    return _yes(sorted(a) == sorted(b))


def _rotation(s: str) -> str:
    a, b = s.split()
    return _yes(len(a) == len(b) and b in a + a)


def word_pairs() -> List[Task]:
    """Pairs of words: anagram, rotation."""
    t: List[Task] = []
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
    return t


def _upper_case(s: str) -> str:
    return _out(_line(s).upper())


def _title_case(s: str) -> str:
    return _out(" ".join(w[:1].upper() + w[1:].lower() for w in s.split()))


def case() -> List[Task]:
    """Case: upper_case, title_case."""
    t: List[Task] = []
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
    return t


def _distinct_words(s: str) -> str:
    return _out(len(set(s.split())))


def _most_common_word(s: str) -> str:
    counts = Counter(s.split())
    return _out(min(counts, key=lambda w: (-counts[w], w)))


def word_counts() -> List[Task]:
    """Counting words: distinct_words, most_common_word."""
    t: List[Task] = []
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
    return t


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


def brackets() -> List[Task]:
    """Brackets: balanced_brackets, paren_depth."""
    t: List[Task] = []
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
    return t


def _count_char(s: str) -> str:
    c, text = s.split("\n")[:2]
    return _out(text.count(c))


def _dedupe_chars(s: str) -> str:
    seen: List[str] = []
    for c in _line(s):
        if c not in seen:
            seen.append(c)
    return _out("".join(seen))


def characters() -> List[Task]:
    """Characters: count_char, dedupe_chars."""
    t: List[Task] = []
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
    return t

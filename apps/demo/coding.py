"""Python coding: small function-writing tasks from parameterised families, graded by hidden unittest tests.

Every family states the task, gives a canonical solution (source the sandbox runs) and, separately, a reference
function that computes the expected outputs of the hidden tests at seed time. The two are written apart on
purpose: tests/apps/demo/test_seed_demo.py runs canonical solutions against the tests, so a slip in either one shows.
"""

import copy
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import reduce

from workers.rl.rollout.tools import RUN_PYTHON_TOOL

from .draft import Draft

SEED = 4242
CASES = 8  # random test cases per task, on top of each family's fixed edge cases

PROMPT = ("{statement}\n\nWrite it in solution.py with this signature:\n\n    {signature}\n\n"
          "Example: {example}")


@dataclass(frozen=True)
class Problem:
    key: str
    family: str
    entry_point: str
    signature: str
    statement: str
    solution: str  # the canonical solution.py
    reference: Callable  # computes expected outputs; never shipped
    edge_cases: tuple  # argument tuples always tested
    draw: Callable[[random.Random], tuple]  # a random argument tuple


def _signed(n: int) -> str:
    """A number as it can appear in an instance key."""
    return f"minus-{-n}" if n < 0 else str(n)


def _ints(rng, low=-20, high=40, most=12):
    return [rng.randint(low, high) for _ in range(rng.randint(1, most))]


def _text(rng, sep=" ", most=6):
    words = ["alpha", "Beta", "gamma", "delta", "Echo", "fox", "kilo", "lima", "Mike", "oscar", "papa", "zulu",
             "to", "a", "sky", "Rhythm", "queue", "idea"]
    return sep.join(rng.choice(words) for _ in range(rng.randint(1, most)))


def sum_multiples() -> Iterator[Problem]:
    for k in range(2, 10):
        for keep in (True, False):
            which = "divisible" if keep else "not divisible"
            op = "==" if keep else "!="
            yield Problem(
                f"sum-{'multiples' if keep else 'non-multiples'}-of-{k}", "sum-multiples",
                "sum_selected", "def sum_selected(xs: list[int]) -> int",
                f"Write sum_selected(xs) returning the sum of the numbers in xs that are {which} by {k}. "
                "Negative numbers count too; an empty list gives 0.",
                f"def sum_selected(xs):\n    return sum(x for x in xs if x % {k} {op} 0)\n",
                lambda xs, k=k, keep=keep: sum(x for x in xs if (x % k == 0) == keep),
                (([],), ([k, k + 1, -k],)), lambda rng: (_ints(rng),))


def clamp() -> Iterator[Problem]:
    for lo, hi in [(-5, 5), (0, 10), (0, 100), (1, 6), (-3, 8), (2, 20), (-10, 0), (5, 9), (-1, 1), (10, 30),
                   (0, 1), (-50, 50), (3, 4), (-8, -2), (7, 70), (0, 255)]:
        yield Problem(
            f"clamp-{_signed(lo)}-{_signed(hi)}", "clamp",
            "clamp_all", "def clamp_all(xs: list[int]) -> list[int]",
            f"Write clamp_all(xs) returning a new list where each value of xs is clamped to the range "
            f"[{lo}, {hi}]: values below {lo} become {lo}, values above {hi} become {hi}. Do not modify xs.",
            f"def clamp_all(xs):\n    return [min(max(x, {lo}), {hi}) for x in xs]\n",
            lambda xs, lo=lo, hi=hi: [lo if x < lo else hi if x > hi else x for x in xs],
            (([],), ([lo - 1, lo, hi, hi + 1],)), lambda rng: (_ints(rng, -300, 300),))


def running() -> Iterator[Problem]:
    ops = {"max": max, "min": min, "sum": sum}
    for name, fn in ops.items():
        for window in (None, 2, 3, 4, 5):
            scope = "of all values so far" if window is None else f"of the last {window} values (fewer at the start)"
            body = ("xs[: i + 1]" if window is None else f"xs[max(0, i - {window - 1}): i + 1]")
            yield Problem(
                f"running-{name}" + (f"-window-{window}" if window else ""), "running",
                f"running_{name}", f"def running_{name}(xs: list[int]) -> list[int]",
                f"Write running_{name}(xs) returning a list whose i-th item is the {name} {scope} up to and "
                "including xs[i]. An empty list gives an empty list.",
                f"def running_{name}(xs):\n    return [{name}({body}) for i in range(len(xs))]\n",
                lambda xs, fn=fn, w=window: [fn(xs[(0 if w is None else max(0, i - w + 1)):i + 1])
                                             for i in range(len(xs))],
                (([],), ([3],)), lambda rng: (_ints(rng),))


def words() -> Iterator[Problem]:
    separators = {" ": "space", ",": "comma", "-": "hyphen", ";": "semicolon", "/": "slash"}
    modes = {
        "reverse-order": ("the words in reverse order", "sep.join(reversed(s.split(sep)))",
                          lambda parts: parts[::-1]),
        "reverse-letters": ("each word spelled backwards, in the original order",
                            "sep.join(w[::-1] for w in s.split(sep))",
                            lambda parts: ["".join(reversed(w)) for w in parts]),
        "capitalise": ("each word with its first letter upper-case and the rest lower-case",
                       "sep.join(w[:1].upper() + w[1:].lower() for w in s.split(sep))",
                       lambda parts: [(w[0].upper() + w[1:].lower()) if w else w for w in parts]),
        "sort-by-length": ("the words sorted from shortest to longest, equal lengths keeping their order",
                           "sep.join(sorted(s.split(sep), key=len))", lambda parts: sorted(parts, key=len)),
    }
    for sep, sep_name in separators.items():
        for mode, (what, expression, transform) in modes.items():
            yield Problem(
                f"words-{mode}-{sep_name}", "words", "rewrite_words", "def rewrite_words(s: str) -> str",
                f"Words in s are separated by single {sep_name} characters ({sep!r}). Write rewrite_words(s) "
                f"returning {what}, joined by the same separator.",
                f"def rewrite_words(s):\n    sep = {sep!r}\n    return {expression}\n",
                lambda s, sep=sep, transform=transform: sep.join(transform(s.split(sep))),
                (("",), (f"one{sep}Two{sep}three",)), lambda rng, sep=sep: (_text(rng, sep),))


def fizzbuzz() -> Iterator[Problem]:
    word_pairs = [("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong"), ("Tick", "Tock")]
    for a, b in [(2, 3), (2, 5), (3, 5), (3, 7), (2, 7), (5, 7)]:
        for first, second in word_pairs:
            yield Problem(
                f"fizzbuzz-{a}-{b}-{first.lower()}{second.lower()}", "fizzbuzz", "fizzbuzz",
                "def fizzbuzz(n: int) -> list[str]",
                f"Write fizzbuzz(n) returning a list of strings for the numbers 1 to n: {first!r} for multiples of "
                f"{a}, {second!r} for multiples of {b}, {first + second!r} for multiples of both, and the number "
                "itself (as a string) otherwise. n = 0 gives an empty list.",
                "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
                f"        word = ({first!r} if i % {a} == 0 else '') + ({second!r} if i % {b} == 0 else '')\n"
                "        out.append(word or str(i))\n    return out\n",
                lambda n, a=a, b=b, x=first, y=second: [
                    x + y if i % (a * b) == 0 else x if i % a == 0 else y if i % b == 0 else str(i)
                    for i in range(1, n + 1)],
                ((0,), (1,), (a * b,)), lambda rng: (rng.randint(2, 60),))


def divisors() -> Iterator[Problem]:
    yield Problem("gcd-of-two", "divisors", "gcd2", "def gcd2(a: int, b: int) -> int",
                  "Write gcd2(a, b) returning the greatest common divisor of two non-negative integers; "
                  "gcd2(0, 0) is 0.",
                  "def gcd2(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
                  math.gcd, ((0, 0), (0, 7), (12, 18)), lambda rng: (rng.randint(0, 500), rng.randint(0, 500)))
    yield Problem("lcm-of-two", "divisors", "lcm2", "def lcm2(a: int, b: int) -> int",
                  "Write lcm2(a, b) returning the least common multiple of two positive integers.",
                  "from math import gcd\n\n\ndef lcm2(a, b):\n    return a * b // gcd(a, b)\n",
                  math.lcm, ((1, 1), (4, 6), (7, 13)), lambda rng: (rng.randint(1, 200), rng.randint(1, 200)))
    yield Problem("gcd-of-list", "divisors", "gcd_all", "def gcd_all(xs: list[int]) -> int",
                  "Write gcd_all(xs) returning the greatest common divisor of a non-empty list of positive integers.",
                  "from functools import reduce\nfrom math import gcd\n\n\n"
                  "def gcd_all(xs):\n    return reduce(gcd, xs)\n",
                  lambda xs: math.gcd(*xs), (([5],), ([12, 18, 24],)),
                  lambda rng: ([rng.randint(1, 12) * rng.choice([1, 2, 3, 6]) for _ in range(rng.randint(1, 5))],))
    yield Problem("lcm-of-list", "divisors", "lcm_all", "def lcm_all(xs: list[int]) -> int",
                  "Write lcm_all(xs) returning the least common multiple of a non-empty list of positive integers.",
                  "from math import lcm\n\n\ndef lcm_all(xs):\n    return lcm(*xs)\n",
                  lambda xs: reduce(lambda p, q: p * q // math.gcd(p, q), xs), (([5],), ([4, 6, 10],)),
                  lambda rng: ([rng.randint(1, 15) for _ in range(rng.randint(1, 5))],))
    for m in (6, 10, 12, 14, 15, 18, 21, 30):
        yield Problem(f"coprime-count-{m}", "divisors", "count_coprime", "def count_coprime(n: int) -> int",
                      f"Write count_coprime(n) returning how many integers in 1..n share no common factor above 1 "
                      f"with {m}. n = 0 gives 0.",
                      f"from math import gcd\n\n\ndef count_coprime(n):\n    return sum(1 for i in range(1, n + 1) "
                      f"if gcd(i, {m}) == 1)\n",
                      lambda n, m=m: len([i for i in range(1, n + 1) if math.gcd(i, m) == 1]),
                      ((0,), (1,), (m,)), lambda rng: (rng.randint(2, 400),))


def count_chars() -> Iterator[Problem]:
    sets = {"vowels": "aeiouAEIOU", "digits": "0123456789", "punctuation": ".,;:!?", "xyz": "xyzXYZ",
            "brackets": "()[]{}"}
    for name, chars in sets.items():
        yield Problem(f"count-{name}", "count-chars", "count_in_set", "def count_in_set(s: str) -> int",
                      f"Write count_in_set(s) returning how many characters of s are among {chars!r}.",
                      f"def count_in_set(s):\n    return sum(1 for c in s if c in {chars!r})\n",
                      lambda s, chars=chars: len([c for c in s if chars.find(c) >= 0]),
                      (("",), (chars,)), lambda rng, chars=chars: (_mixed(rng, chars),))
        yield Problem(f"remove-{name}", "count-chars", "strip_set", "def strip_set(s: str) -> str",
                      f"Write strip_set(s) returning s with every character among {chars!r} removed.",
                      f"def strip_set(s):\n    return ''.join(c for c in s if c not in {chars!r})\n",
                      lambda s, chars=chars: s.translate({ord(c): None for c in chars}),
                      (("",), (chars + "k",)), lambda rng, chars=chars: (_mixed(rng, chars),))


def _mixed(rng, chars):
    pool = "abcdefghijk lmnopqrstuvwXYZ 0123 .,!?(]" + chars
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, 30)))


def chunks() -> Iterator[Problem]:
    for k in range(2, 8):
        for keep in (True, False):
            tail = "The last chunk may be shorter." if keep else f"Drop a last chunk shorter than {k}."
            stop = "len(xs)" if keep else f"len(xs) - len(xs) % {k}"
            yield Problem(f"chunk-{k}-{'keep' if keep else 'drop'}-tail", "chunks", "chunk",
                          "def chunk(xs: list[int]) -> list[list[int]]",
                          f"Write chunk(xs) splitting xs into consecutive chunks of {k} items. {tail}",
                          f"def chunk(xs):\n    return [xs[i:i + {k}] for i in range(0, {stop}, {k})]\n",
                          lambda xs, k=k, keep=keep: [xs[i:i + k] for i in range(0, len(xs), k)
                                                      if keep or i + k <= len(xs)],
                          (([],), (list(range(k)),), (list(range(k + 1)),)), lambda rng: (_ints(rng, most=20),))


def rotate() -> Iterator[Problem]:
    for k in range(1, 7):
        for direction in ("left", "right"):
            shift = f"{k} % len(xs)" if direction == "left" else f"-({k} % len(xs))"
            yield Problem(f"rotate-{direction}-{k}", "rotate", "rotate", "def rotate(xs: list[int]) -> list[int]",
                          f"Write rotate(xs) returning xs rotated {direction} by {k} places (wrapping around, so "
                          f"rotating a list of length n by n gives it back). An empty list gives an empty list.",
                          f"def rotate(xs):\n    if not xs:\n        return []\n    s = {shift}\n"
                          "    return xs[s:] + xs[:s]\n",
                          lambda xs, k=k, d=direction: [xs[(i + (k if d == "left" else -k)) % len(xs)]
                                                        for i in range(len(xs))],
                          (([],), ([1],), (list(range(k)),)), lambda rng: (_ints(rng),))


def recurrence() -> Iterator[Problem]:
    for a0, a1, p, q in [(0, 1, 1, 1), (2, 1, 1, 1), (1, 1, 1, 2), (0, 1, 2, 1), (1, 3, 1, 1), (3, 0, 1, 1),
                         (1, 2, 2, -1), (0, 1, 3, -2), (2, 2, 1, 1), (1, 0, 0, 1), (5, 8, 1, 1), (1, 1, 2, 0),
                         (0, 2, 1, 3), (4, 1, 1, -1), (1, 4, 2, 2), (0, 1, 1, -1)]:
        yield Problem(f"recurrence-{a0}-{a1}-{p}-{_signed(q)}", "recurrence", "nth_term",
                      "def nth_term(n: int) -> int",
                      f"A sequence starts a(0) = {a0}, a(1) = {a1} and continues a(n) = {p} * a(n-1) + ({q}) * a(n-2). "
                      "Write nth_term(n) returning a(n) for n >= 0.",
                      f"def nth_term(n):\n    a, b = {a0}, {a1}\n    for _ in range(n):\n"
                      f"        a, b = b, {p} * b + ({q}) * a\n    return a\n",
                      lambda n, a0=a0, a1=a1, p=p, q=q: _term(n, a0, a1, p, q),
                      ((0,), (1,), (2,)), lambda rng: (rng.randint(3, 40),))


def _term(n, a0, a1, p, q):
    seq = [a0, a1]
    while len(seq) <= n:
        seq.append(p * seq[-1] + q * seq[-2])
    return seq[n]


def caesar() -> Iterator[Problem]:
    for shift in (1, 2, 3, 5, 7, 9, 11, 13, 17, 20, 23, 25):
        yield Problem(f"caesar-{shift}", "caesar", "encode", "def encode(s: str) -> str",
                      f"Write encode(s) shifting every ASCII letter of s forward by {shift} places in the alphabet, "
                      "wrapping from z to a and keeping upper and lower case; other characters stay as they are.",
                      "def encode(s):\n    out = []\n    for c in s:\n        if 'a' <= c <= 'z' or 'A' <= c <= 'Z':\n"
                      "            base = ord('a') if c.islower() else ord('A')\n"
                      f"            c = chr((ord(c) - base + {shift}) % 26 + base)\n"
                      "        out.append(c)\n    return ''.join(out)\n",
                      lambda s, k=shift: s.translate(_shift_table(k)),
                      (("",), ("xyz XYZ!",)), lambda rng: (_text(rng) + rng.choice(["", "!", " 42"]),))


def _shift_table(k):
    lower = "abcdefghijklmnopqrstuvwxyz"
    upper = lower.upper()
    return str.maketrans(lower + upper, lower[k:] + lower[:k] + upper[k:] + upper[:k])


def digit_sum() -> Iterator[Problem]:
    for base in range(2, 17):
        yield Problem(f"digit-sum-base-{base}", "digit-sum", "digit_sum", "def digit_sum(n: int) -> int",
                      f"Write digit_sum(n) returning the sum of the digits of the non-negative integer n written in "
                      f"base {base} (each digit counted by its value, so a base-16 'f' counts 15).",
                      f"def digit_sum(n):\n    total = 0\n    while n:\n        n, d = divmod(n, {base})\n"
                      "        total += d\n    return total\n",
                      lambda n, b=base: sum(_digits(n, b)), ((0,), (base - 1,), (base,)),
                      lambda rng: (rng.randint(0, 10 ** rng.randint(1, 7)),))


def _digits(n, base):
    return [int(c, 36) for c in _to_base(n, base)]


def _to_base(n, base):
    s = ""
    while n:
        s = "0123456789abcdefghijklmnopqrstuvwxyz"[n % base] + s
        n //= base
    return s or "0"


def long_words() -> Iterator[Problem]:
    for k in range(2, 10):
        for longer in (True, False):
            cmp, phrase = (">", f"longer than {k}") if longer else ("<=", f"at most {k}")
            yield Problem(f"count-words-{'longer-than' if longer else 'at-most'}-{k}", "long-words", "count_words",
                          "def count_words(s: str) -> int",
                          f"Words in s are separated by whitespace. Write count_words(s) returning how many words "
                          f"have a length {phrase} characters.",
                          f"def count_words(s):\n    return sum(1 for w in s.split() if len(w) {cmp} {k})\n",
                          lambda s, k=k, longer=longer: len([w for w in s.split() if (len(w) > k) is longer]),
                          (("",), ("a " + "b" * k + " " + "c" * (k + 1),)), lambda rng: (_text(rng, most=10),))


def kth_largest() -> Iterator[Problem]:
    for k in range(1, 6):
        yield Problem(f"kth-largest-distinct-{k}", "kth-largest", "kth_largest",
                      "def kth_largest(xs: list[int]) -> int | None",
                      f"Write kth_largest(xs) returning the {_ordinal(k)} largest distinct value in xs, or None if xs "
                      f"has fewer than {k} distinct values.",
                      f"def kth_largest(xs):\n    values = sorted(set(xs), reverse=True)\n"
                      f"    return values[{k - 1}] if len(values) >= {k} else None\n",
                      lambda xs, k=k: _kth(xs, k), (([],), ([7] * (k + 1),), (list(range(k)),)),
                      lambda rng: (_ints(rng, -5, 15),))


def _kth(xs, k):
    distinct = []
    for x in sorted(xs, reverse=True):
        if x not in distinct:
            distinct.append(x)
    return distinct[k - 1] if len(distinct) >= k else None


def _ordinal(k):
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(k, f"{k}th")


def above_threshold() -> Iterator[Problem]:
    for t in (-5, 0, 3, 7, 10, 15, 20, 25):
        yield Problem(f"indices-above-{_signed(t)}", "above-threshold", "indices_above",
                      "def indices_above(xs: list[int]) -> list[int]",
                      f"Write indices_above(xs) returning, in increasing order, the indices i where xs[i] > {t}.",
                      f"def indices_above(xs):\n    return [i for i, x in enumerate(xs) if x > {t}]\n",
                      lambda xs, t=t: [i for i in range(len(xs)) if xs[i] > t], (([],), ([t, t + 1],)),
                      lambda rng: (_ints(rng),))


FAMILIES = [sum_multiples, clamp, running, words, fizzbuzz, divisors, count_chars, chunks, rotate, recurrence,
            caesar, digit_sum, long_words, kth_largest, above_threshold]


def problems() -> list[Problem]:
    return [problem for family in FAMILIES for problem in family()]


def _call(entry_point: str, args: tuple) -> str:
    return f"{entry_point}({', '.join(repr(a) for a in args)})"


def _tests_source(problem: Problem, cases: list[tuple]) -> str:
    rows = "".join(f"        ({args!r}, {expected!r}),\n" for args, expected in cases)
    return (
        "import copy\nimport unittest\n\n"
        f"from solution import {problem.entry_point}\n\n\n"
        f"class Test{problem.entry_point.title().replace('_', '')}(unittest.TestCase):\n"
        "    CASES = [\n"
        f"{rows}"
        "    ]\n\n"
        "    def test_cases(self):\n"
        "        for args, expected in self.CASES:\n"
        "            with self.subTest(args=args):\n"
        f"                self.assertEqual({problem.entry_point}(*copy.deepcopy(args)), expected)\n\n"
        "    def test_arguments_left_unchanged(self):\n"
        "        for args, _ in self.CASES:\n"
        "            kept = copy.deepcopy(args)\n"
        f"            {problem.entry_point}(*args)\n"
        "            self.assertEqual(args, kept)\n\n\n"
        'if __name__ == "__main__":\n'
        "    unittest.main()\n"
    )


def instance(problem: Problem, rng: random.Random) -> dict:
    arg_sets, cases = list(problem.edge_cases), []
    for _ in range(CASES * 4):  # draws may repeat; stop once CASES new ones are in
        if len(arg_sets) >= len(problem.edge_cases) + CASES:
            break
        args = problem.draw(rng)
        if args not in arg_sets:
            arg_sets.append(args)
    for args in arg_sets:
        cases.append((args, problem.reference(*copy.deepcopy(args))))
    example_args, example_out = cases[-1]
    return {
        "key": problem.key,
        "inputs": {"family": problem.family, "statement": problem.statement, "signature": problem.signature,
                   "example": f"{_call(problem.entry_point, example_args)} == {example_out!r}"},
        "hidden": {"entry_point": problem.entry_point, "tests": _tests_source(problem, cases),
                   "canonical_solution": problem.solution},
    }


def instances() -> list[dict]:
    rng = random.Random(SEED)
    return [instance(problem, rng) for problem in problems()]


def drafts() -> list[Draft]:
    template = {
        "system_prompt": "You write small, correct Python functions. Reply with the complete solution.py in one "
                         "```python block. You may run code in the sandbox first.",
        "prompt_template": PROMPT,
        "tools": [RUN_PYTHON_TOOL],
        "sandbox_image": "python-3-11",
        "verifier": "python-unit-tests",
        "limits": {"max_turns": 6, "max_tokens": 4096, "max_seconds": 120},
    }
    return [
        Draft("task_template", "python-functions", "Write one small function to a statement; hidden unittest "
              "tests decide.", template, instances()),
        Draft("domain", "python-coding", "Function-writing tasks graded by unit tests in a sandbox.",
              {"sampling_weight": 2.0, "templates": [{"template": "python-functions", "weight": 1.0}]}),
    ]

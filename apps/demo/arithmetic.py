"""Arithmetic (two-number addition small enough for a tiny character-level model) and word problems."""

import random

from .draft import Draft

SEED = 1729
ADD_LIMIT = 30  # a and b below this: 900 sums, all of them
WORD_PROBLEMS = 360

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena", "Mira",
         "Nils", "Omar", "Priya", "Rosa", "Sami", "Tomas", "Uma", "Vera", "Wen", "Yusuf", "Zoe"]
ITEMS = ["apples", "pencils", "notebooks", "oranges", "stickers", "candles", "marbles", "cookies", "batteries",
         "postcards"]


def add_two_instances() -> list[dict]:
    return [{"key": f"add-{a:02d}-{b:02d}", "inputs": {"a": a, "b": b}, "hidden": {"answer": a + b}}
            for a in range(ADD_LIMIT) for b in range(ADD_LIMIT)]


def _change(rng):
    name, item, n, price = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(2, 9), rng.randint(2, 12)
    cost = n * price
    note = next(v for v in (20, 50, 100, 200) if v >= cost)
    return (f"{name} buys {n} {item} at {price} dollars each and pays with a {note}-dollar note. "
            f"How many dollars of change does {name} get?",
            note - cost, f"{n} * {price} = {cost}; {note} - {cost} = {note - cost}")


def _split_bill(rng):
    friends, share, tip = rng.randint(2, 8), rng.randint(6, 40), rng.randint(1, 9)
    total = friends * share
    return (f"{friends} friends split a bill of {total} dollars equally, and each of them also leaves a {tip}-dollar "
            "tip. How many dollars does each friend pay in total?",
            share + tip, f"{total} / {friends} = {share}; {share} + {tip} = {share + tip}")


def _stock(rng):
    item, start = rng.choice(ITEMS), rng.randint(40, 200)
    monday, tuesday, delivery = rng.randint(5, start // 3), rng.randint(5, start // 3), rng.randint(10, 90)
    left = start - monday - tuesday + delivery
    return (f"A shop has {start} {item}. It sells {monday} on Monday and {tuesday} on Tuesday, then receives a "
            f"delivery of {delivery}. How many {item} does it have now?",
            left, f"{start} - {monday} - {tuesday} = {start - monday - tuesday}; + {delivery} = {left}")


def _journey(rng):
    v, h, w, g = rng.randint(4, 12) * 10, rng.randint(1, 4), rng.randint(3, 11) * 10, rng.randint(1, 3)
    return (f"A train travels at {v} km per hour for {h} hours, then at {w} km per hour for {g} hours. "
            "How many kilometres does it travel in total?",
            v * h + w * g, f"{v} * {h} = {v * h}; {w} * {g} = {w * g}; {v * h} + {w * g} = {v * h + w * g}")


def _boxes(rng):
    name, item, size = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(4, 12)
    full, loose = rng.randint(5, 15), rng.randint(1, size - 1)
    given = rng.randint(1, full - 1)
    total = full * size + loose
    return (f"{name} packs {total} {item} into boxes of {size}, filling as many boxes as possible, and then "
            f"gives away {given} full boxes. How many full boxes does {name} have left?",
            full - given, f"{total} // {size} = {full}; {full} - {given} = {full - given}")


def _ages(rng):
    a, b = rng.sample(NAMES, 2)
    age, gap, years = rng.randint(4, 40), rng.randint(2, 30), rng.randint(2, 20)
    return (f"{a} is {age} years old. {b} is {gap} years older than {a}. How old will {b} be in {years} years?",
            age + gap + years, f"{age} + {gap} = {age + gap}; {age + gap} + {years} = {age + gap + years}")


def _savings(rng):
    name, weekly, weeks = rng.choice(NAMES), rng.randint(3, 25), rng.randint(3, 20)
    spent = rng.randint(1, weekly * weeks - 1)
    saved = weekly * weeks
    return (f"{name} saves {weekly} dollars every week for {weeks} weeks and then spends {spent} dollars on a "
            "gift. How many dollars are left?",
            saved - spent, f"{weekly} * {weeks} = {saved}; {saved} - {spent} = {saved - spent}")


def _garden(rng):
    rows, per_row, died, added = rng.randint(3, 15), rng.randint(4, 20), rng.randint(1, 10), rng.randint(1, 25)
    plants = rows * per_row
    return (f"A garden has {rows} rows of {per_row} plants. {died} plants die and {added} new plants are added. "
            "How many plants are in the garden now?",
            plants - died + added, f"{rows} * {per_row} = {plants}; {plants} - {died} + {added} = "
                                   f"{plants - died + added}")


PROBLEM_KINDS = [_change, _split_bill, _stock, _journey, _boxes, _ages, _savings, _garden]


def multi_step_instances() -> list[dict]:
    rng, seen, items = random.Random(SEED), set(), []
    while len(items) < WORD_PROBLEMS:
        question, answer, working = rng.choice(PROBLEM_KINDS)(rng)
        if question in seen:
            continue
        seen.add(question)
        items.append({"key": f"word-{len(items):04d}", "inputs": {"question": question},
                      "hidden": {"answer": answer, "working": working}})
    return items


def drafts() -> list[Draft]:
    add_two = {
        "prompt_template": "{a}+{b}=",
        "sandbox_image": "python-3-11",
        "verifier": "numeric-exact",
        "limits": {"max_turns": 1, "max_tokens": 4, "max_seconds": 5},
    }
    multi_step = {
        "system_prompt": "Solve the problem step by step. Put the final answer, a single integer, on the last "
                         "line as: Answer: <integer>",
        "prompt_template": "{question}",
        "sandbox_image": "python-3-11",
        "verifier": "numeric-exact",
        "limits": {"max_turns": 1, "max_tokens": 512, "max_seconds": 30},
    }
    return [
        Draft("task_template", "add-two", "a+b= for a, b below 30: learnable by a tiny character-level model.",
              add_two, add_two_instances()),
        Draft("task_template", "multi-step", "Two- and three-step word problems with an exact integer answer.",
              multi_step, multi_step_instances()),
        # Two domains, not one: they train different skills (sums a tiny model can learn; reading a problem and
        # chaining steps, which takes a real model), and each gets its own curve and curriculum share.
        Draft("domain", "arithmetic", "Exact-answer arithmetic.",
              {"sampling_weight": 1.0, "templates": [{"template": "add-two", "weight": 1.0}]}),
        Draft("domain", "word-problems", "Multi-step word problems with an exact integer answer.",
              {"sampling_weight": 1.0, "templates": [{"template": "multi-step", "weight": 1.0}]}),
    ]

"""`manage.py import_tasks`: a code benchmark in the common shape, imported and verified end to end."""

import gzip
import json

import pytest
from django.core.management import CommandError, call_command

from apps.registry.models import Version
from apps.registry.services import version_publish

TASKS = [
    ("Bench/0", "add", "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n", "    return a + b\n",
     "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-4, 4) == 0\n"),
    ("Bench/1", "reverse_words", "def reverse_words(s):\n    \"\"\"Reverse the order of words.\"\"\"\n",
     "    return ' '.join(reversed(s.split()))\n",
     "def check(candidate):\n    assert candidate('a b c') == 'c b a'\n    assert candidate('one') == 'one'\n"),
    ("Bench/2", "is_prime", "def is_prime(n):\n    \"\"\"True if n is prime.\"\"\"\n",
     "    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
     "def check(candidate):\n    assert candidate(13) is True\n    assert candidate(1) is False\n"
     "    assert candidate(91) is False\n"),
]


@pytest.fixture
def template(project, owner):
    def publish(kind, slug, spec, **extra):
        return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, **extra).version

    publish("sandbox_image", "bench-python", {"layers": [{"type": "base", "image": "python-3.11"}]})
    publish("verifier", "bench-tests", {"layers": [{"name": "tests", "kind": "exact", "checks": [
        {"type": "unit_tests", "timeout_seconds": 10}]}]})
    return publish("task_template", "bench", {"prompt_template": "Complete this function:\n{prompt}",
                                               "sandbox_image": "bench-python", "verifier": "bench-tests"})


def write_benchmark(path):
    with gzip.open(path, "wt") as handle:
        for task_id, entry_point, prompt, body, test in TASKS:
            handle.write(json.dumps({"task_id": task_id, "prompt": prompt, "canonical_solution": body,
                                     "test": test, "entry_point": entry_point}) + "\n")


@pytest.mark.sandbox  # `verify` runs the unit tests in sandboxes
def test_canonical_solutions_score_one_and_wrong_ones_zero(template, tmp_path, capsys):
    benchmark = tmp_path / "bench.jsonl.gz"
    write_benchmark(benchmark)
    call_command("import_tasks", str(benchmark), "--template", "bench", "--format", "code-benchmark")
    head = Version.objects.filter(definition__slug="bench").order_by("-number").first()
    assert head.number == 2 and head.instance_set.count == 3 and head.parent_id == template.pk
    batch = tmp_path / "batch.jsonl"
    lines = []
    for task_id, _entry_point, prompt, body, _ in TASKS:
        lines.append({"task_key": task_id, "response": f"```python\n{prompt}{body}```"})
        lines.append({"task_key": task_id, "response": f"```python\n{prompt}    return None\n```"})
    batch.write_text("\n".join(json.dumps(line) for line in lines))
    capsys.readouterr()
    call_command("verify", "--template", "bench", "--batch", str(batch))
    rewards = [json.loads(line)["reward"] for line in capsys.readouterr().out.splitlines()]
    assert rewards == [1.0, 0.0] * len(TASKS)


def test_reimporting_adds_nothing_and_exact_answers_import_too(template, tmp_path, project, owner):
    benchmark = tmp_path / "bench.jsonl.gz"
    write_benchmark(benchmark)
    call_command("import_tasks", str(benchmark), "--template", "bench", "--format", "code-benchmark")
    call_command("import_tasks", str(benchmark), "--template", "bench", "--format", "code-benchmark")
    assert Version.objects.filter(definition__slug="bench").count() == 2
    answers = tmp_path / "answers.jsonl"
    answers.write_text('{"key": "q1", "prompt": "2+2?", "answer": 4}\n{"key": "q2", "prompt": "3*3?", "answer": 9}\n')
    call_command("import_tasks", str(answers), "--template", "bench", "--format", "exact-answer")
    head = Version.objects.filter(definition__slug="bench").order_by("-number").first()
    assert head.number == 3 and head.instance_set.count == 5


def test_bad_lines_are_named_and_nothing_is_imported(template, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "ok/1", "prompt": "p", "canonical_solution": "s", "test": "t", "entry_point": "f"}\n'
                   'this is not json\n'
                   '{"task_id": "x", "prompt": 5, "canonical_solution": "s", "test": "t", "entry_point": "f"}\n'
                   '\n'
                   '{"task_id": "y", "prompt": "p"}\n')
    with pytest.raises(CommandError, match="3 problem"):
        call_command("import_tasks", str(bad), "--template", "bench", "--format", "code-benchmark")
    err = capsys.readouterr().err
    assert "line 2: not JSON" in err and "line 3: prompt must be text" in err
    assert "line 5: missing canonical_solution, test, entry_point" in err
    assert Version.objects.filter(definition__slug="bench").count() == 1


def test_a_task_missing_a_prompt_input_is_named_by_its_key(project, owner, template, tmp_path, capsys):
    version_publish(project=project, kind="task_template", slug="bench", author=owner,
                    spec={**template.spec, "prompt_template": "{prompt} in {language}"})
    benchmark = tmp_path / "bench.jsonl.gz"
    write_benchmark(benchmark)
    with pytest.raises(CommandError):
        call_command("import_tasks", str(benchmark), "--template", "bench", "--format", "code-benchmark")
    assert "task 'Bench/0'.inputs: missing language (used by prompt_template)" in capsys.readouterr().err


GOOD_LINE = '{"task_id": "ok/1", "prompt": "p", "canonical_solution": "s", "test": "t", "entry_point": "f"}\n'


@pytest.mark.parametrize("line, problem", [
    ('{"task_id": "deep", "prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", "line 2: nested deeper than 64 levels"),
    ('{"task_id": "s", "prompt": "\\ud800", "canonical_solution": "s", "test": "t", "entry_point": "f"}',
     "line 2: prompt holds a lone surrogate (such as \\ud800), which is not Unicode text"),
    ('{"task_id": "s\\udfff", "prompt": "p", "canonical_solution": "s", "test": "t", "entry_point": "f"}',
     "line 2: task_id holds a lone surrogate"),
    ('{"task_id": "n", "prompt": "p", "canonical_solution": "s", "test": "t", "entry_point": "f", '
     '"extra": 1' + "0" * 5000 + "}", "line 2: a value cannot be read"),
], ids=["nested-100000", "surrogate-in-a-value", "surrogate-in-the-key", "5001-digit-integer"])
def test_a_line_no_task_can_hold_is_named_and_nothing_is_imported(template, tmp_path, capsys, line, problem):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD_LINE + line + "\n" + GOOD_LINE.replace("ok/1", "ok/2"))
    with pytest.raises(CommandError, match="1 problem"):
        call_command("import_tasks", str(bad), "--template", "bench", "--format", "code-benchmark")
    err = capsys.readouterr().err
    assert problem in err, err[-2000:]
    assert Version.objects.filter(definition__slug="bench").count() == 1


"""Public benchmarks in their own shapes: the GSM8K and MMLU samples the repository ships (public_benchmarks/)
import into the templates and verifiers it ships beside them, a right answer scores 1 and a wrong one 0, and a row
that is not in the shape is named by its line."""

import json

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from apps.registry.models import Version
from apps.registry.selectors import instance_rows
from apps.task_import.task_files import read_tasks
from tests.support import ROOT
from workers.definitions.specs import parse_spec
from workers.verifiers.pipeline import verify
from workers.verifiers.types import Item, Sample

PUBLIC_BENCHMARKS = ROOT / "public_benchmarks"


@pytest.fixture
def benchmarks(project, owner):
    call_command("registry", "import", str(PUBLIC_BENCHMARKS / "envs"), "--project", project.slug)
    return project


def _head(slug: str) -> Version:
    return Version.objects.filter(definition__slug=slug, definition__kind="task_template").order_by("-number").first()


def _verifier(slug: str) -> dict:
    return Version.objects.filter(definition__slug=slug, definition__kind="verifier").order_by("-number").first().spec


def _tasks(slug: str) -> dict[str, Item]:
    return {key: Item(key, inputs, hidden) for key, inputs, hidden in instance_rows(version=_head(slug))}


def test_gsm8k_imports_its_final_number_and_grades_it(benchmarks):
    call_command("import_tasks", str(PUBLIC_BENCHMARKS / "samples" / "gsm8k.jsonl"), "--template", "gsm8k",
                 "--format", "gsm8k", "--project", benchmarks.slug)
    tasks = _tasks("gsm8k")
    assert sorted(tasks) == ["0", "1", "2"]  # GSM8K has no ids: its rows' places, lm-evaluation-harness's doc_id
    assert tasks["2"].hidden["answer"] == "1375"  # "#### 1,375": the number, without its thousands separator
    assert tasks["0"].hidden["solution"].endswith("72 - 50 = <<72-50=22>>22 left.")
    assert tasks["1"].inputs == {"question": "Mia reads 15 pages a day for 4 days, then 20 pages a day for 3 days. "
                                             "How many pages does she read?"}
    spec = parse_spec("verifier", _verifier("gsm8k-number"))
    rewards = [verify(spec, Sample(response=response), tasks["2"], None).reward
               for response in ("One of each is 11 dollars, so 125 cost 1,375 dollars.", "#### 1375",
                                "They cost 1374 dollars.")]
    assert rewards == [1.0, 1.0, 0.0]


def test_multiple_choice_imports_letters_and_choices_and_grades_the_letter(benchmarks):
    call_command("import_tasks", str(PUBLIC_BENCHMARKS / "samples" / "mmlu.jsonl"), "--template", "mmlu",
                 "--format", "multiple-choice", "--project", benchmarks.slug)
    tasks = _tasks("mmlu")
    planets = tasks["2"]
    assert planets.inputs == {"question": "Which planet is closest to the Sun?", "subject": "astronomy",
                              "choices": "A. Venus\nB. Earth\nC. Mercury\nD. Mars"}
    assert planets.hidden == {"answer": "C", "answer_index": 2, "choices": ["Venus", "Earth", "Mercury", "Mars"]}
    spec = parse_spec("verifier", _verifier("choice-letter"))
    assert [verify(spec, Sample(response=letter), planets, None).reward for letter in "CAB"] == [1.0, 0.0, 0.0]
    prompt = _head("mmlu").spec["prompt_template"].format(**planets.inputs)
    assert prompt == "Which planet is closest to the Sun?\nA. Venus\nB. Earth\nC. Mercury\nD. Mars\nAnswer:"


def test_rows_out_of_shape_are_named_by_line_and_nothing_is_imported(benchmarks, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    rows = [{"question": "q", "answer": "worked out\n#### 4"},
            {"question": "q", "answer": "no final line"},
            {"question": "q", "answer": "#### "},
            {"question": 3, "answer": "#### 3"}]
    bad.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(CommandError, match="3 problem"):
        call_command("import_tasks", str(bad), "--template", "gsm8k", "--format", "gsm8k",
                     "--project", benchmarks.slug)
    err = capsys.readouterr().err
    assert "line 2: answer has no '#### <number>' line" in err and "line 3: answer has nothing after '####'" in err
    assert "line 4: question must be text" in err
    assert _head("gsm8k").number == 1

    choices = tmp_path / "choices.jsonl"
    rows = [{"question": "q", "choices": ["a", "b"], "answer": "B"},
            {"question": "q", "choices": ["a", "b"], "answer": 2},
            {"question": "q", "choices": "a, b", "answer": 0},
            {"question": "q", "choices": ["a", ""], "answer": 0},
            {"id": "own-key", "question": "q", "choices": ["a", "b", "c"], "answer": "1"}]
    choices.write_text("".join(json.dumps(row) + "\n" for row in rows))
    found = read_tasks(choices, "multiple-choice")
    assert [str(e) for e in found.errors] == [
        "line 2: answer must be the right choice's index (0 to 1) or its letter (A to B), not 2",
        "line 3: choices must be a list of 2 to 26 texts, none empty",
        "line 4: choices must be a list of 2 to 26 texts, none empty"]
    assert [(i["key"], i["hidden"]["answer"]) for i in found.instances] == [("0", "B"), ("own-key", "B")]


def test_the_upload_page_offers_the_benchmark_formats(benchmarks, login, owner):
    client = login(owner)
    page = client.get(reverse("task_import:task_upload", kwargs={"project": benchmarks.slug,
                                                                 "kind": "task_template", "slug": "gsm8k"}))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'value="gsm8k"' in html and 'value="multiple-choice"' in html

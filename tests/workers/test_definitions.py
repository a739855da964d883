"""Task templates' examples: an earlier exchange shown before each prompt, validated as a conversation, and
left out of the spec (and its content hash) when there is none; the engine's template, its specs parsed once."""

import pytest
from pydantic import ValidationError

from tests.support.specimens import TEMPLATE_SPEC, VERIFIER_SPEC
from workers.definitions import SpecError, content_hash, validate_spec
from workers.definitions.specs import VerifierSpec
from workers.rl.rollout.tools import RUN_PYTHON_TOOL
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage
from workers.verifiers import Item

EXCHANGE = [{"role": "user", "content": "What is 1 + 1?"},
            {"role": "assistant", "content": '<tool_call>{"name": "run_python", "arguments": {"code": "print(2)"}}'
                                             "</tool_call>"},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "2"}]


def test_a_template_without_examples_keeps_the_content_hash_it_had_before_they_existed():
    spec = validate_spec("task_template", TEMPLATE_SPEC)
    assert "examples" not in spec
    assert content_hash(validate_spec("task_template", {**TEMPLATE_SPEC, "examples": []})) == content_hash(spec)
    with_examples = validate_spec("task_template", {**TEMPLATE_SPEC, "examples": EXCHANGE})
    assert with_examples["examples"] == EXCHANGE and content_hash(with_examples) != content_hash(spec)


@pytest.mark.parametrize(("examples", "problem"), [
    (EXCHANGE[1:], "begin with a user turn"),
    (EXCHANGE[:3], "end with an assistant turn"),
    ([EXCHANGE[0], EXCHANGE[0], EXCHANGE[3]], "two user turns in a row"),
    ([EXCHANGE[0], EXCHANGE[2], EXCHANGE[3]], "a tool result follows the assistant turn"),
    ([{"role": "system", "content": "x"}, EXCHANGE[3]], "examples[0].role: Input should be"),
])
def test_examples_that_are_not_a_conversation_are_refused_with_their_field(examples, problem):
    with pytest.raises(SpecError) as caught:
        validate_spec("task_template", {**TEMPLATE_SPEC, "examples": examples})
    assert problem in str(caught.value) and all(e.field.startswith("examples") for e in caught.value.errors)


def test_the_model_reads_the_examples_but_a_trajectory_opens_with_the_instance_alone():
    spec = validate_spec("task_template", {**TEMPLATE_SPEC, "system_prompt": "Be exact.", "examples": EXCHANGE})
    template = TaskTemplate.from_spec(key="task_template/add@1", domain="d", spec=spec,
                                      image=SandboxImage(key="sandbox_image/x@1", layers=()),
                                      verifier_key="verifier/v@1", verifier_spec=VERIFIER_SPEC)
    item = Item(key="k", inputs={"a": 2, "b": 3}, hidden={})
    prompted = template.messages(item)
    assert [m["role"] for m in prompted] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert prompted[-1]["content"] == "What is 2 + 3?" and prompted[1:5] == EXCHANGE
    assert template.messages(item, examples=False) == [prompted[0], prompted[-1]]


def test_the_engines_template_parses_its_specs_once_and_refuses_a_bad_one_naming_the_field():
    def built(spec: dict, verifier: dict = VERIFIER_SPEC) -> TaskTemplate:
        return TaskTemplate.from_spec(key="task_template/add@1", domain="d", spec=spec, verifier_key="verifier/v@1",
                                      verifier_spec=verifier, image=SandboxImage(key="sandbox_image/x@1", layers=()))

    template = built({**TEMPLATE_SPEC, "tools": [RUN_PYTHON_TOOL], "session": {"max_calls": 5}})
    assert (template.limits.max_turns, template.limits.max_turn_calls) == (1, 0)  # defaults filled in
    assert template.session.max_calls == 5 and template.session.lifetime == 3600
    assert template.context.when_full == "end" and isinstance(template.verifier_spec, VerifierSpec)
    assert template.tool_schemas == (RUN_PYTHON_TOOL,)  # what a chat template and an OpenAI endpoint take
    with pytest.raises(ValidationError, match="frozen"):  # shared by every rollout thread
        template.limits.max_turns = 9
    with pytest.raises(SpecError, match="task_template/add@1 limits.max_turns: Input should be greater than or "
                                        "equal to 1"):
        built({**TEMPLATE_SPEC, "limits": {"max_turns": 0}})
    with pytest.raises(SpecError, match="task_template/add@1 session.max_call: unknown field"):
        built({**TEMPLATE_SPEC, "session": {"max_call": 5}})
    with pytest.raises(SpecError, match="verifier/v@1 layers: List should have at least 1 item"):
        built(TEMPLATE_SPEC, verifier={"layers": []})


def test_an_unknown_field_names_the_fields_that_exist_there_through_lists_and_tagged_unions():
    from workers.definitions.specs import SpecError, validate_spec

    spec = {"layers": [{"name": "a", "kind": "exact", "checks": [{"type": "numeric", "tolerance": 1}]}]}
    with pytest.raises(SpecError) as caught:
        validate_spec("verifier", spec)
    error, = caught.value.errors
    assert error.field == "layers[0].checks[0].tolerance"
    assert error.problem == ("unknown field; the fields here are name, weight, type, reference, abs_tolerance, "
                             "rel_tolerance, parse_scale")  # the numeric check's, not another check type's
    with pytest.raises(SpecError) as caught:
        validate_spec("model", {"source": {"type": "local", "path": "/models/x", "revision": "main"}})
    assert [e.problem for e in caught.value.errors] == ["unknown field; the fields here are type, path"]

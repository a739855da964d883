"""The demo's base model, made here: a character-level TinyLM pretrained in about a minute on the CPU on
noisy renderings of the demo's own tasks.

Each task instance becomes a conversation in the CharChat format: the prompt, then an answer built from the
instance's hidden reference (the number, the canonical solution, the reference script, the cited sentence),
sometimes preceded by a tool call and its result. Half of the answers are corrupted on purpose — one number
in them is off — so the model learns the formats and has seen the answers without learning which are
right: it is unreliable in the way RL on verifiable rewards fixes. (Short tasks such as `12+7=` get most of
the pretraining; the long formats of code, JSON and scripts get enough to be written, rarely correctly.)
"""

from __future__ import annotations

import json
import random
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from workers.definitions.specs import ToolSpec
from workers.verifiers.generated import answer_response, is_generated
from workers.verifiers.repository import snapshot_contents

from .chat_formats import CharChat
from .tiny_lm import ModelConfig, TinyLM

NUMBER = re.compile(r"(?<![A-Za-z_])\d+")
SHORT_EXAMPLE_CHARS = 48  # an example this short trains in the cheap short-context batches


@dataclass(frozen=True)
class Example:
    """One pretraining conversation: messages in the chat format's roles."""

    messages: tuple[dict, ...]


def _code_block(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


# The software-engineering tool set's names (rollout/swe_tools.py, which this layer does not import).
SWE_TOOL_NAMES = {"bash", "str_replace_editor", "submit"}
REFERENCE_WINDOW = 30  # lines the reference reads of a file per view, as an agent scrolls


def _hunks(patch: str) -> list[tuple[str, int, str, str]]:
    """(path, first line in the new file, old text, new text) of each hunk of a unified diff."""
    hunks, path, current = [], None, None
    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ "):
            path = line[4:].strip().removeprefix("b/")
        elif line.startswith("@@"):
            start = int(re.match(r"@@ -\d+(?:,\d+)? \+(\d+)", line)[1])
            current = [path, start, "", ""]
            hunks.append(current)
        elif current is not None and line[:1] in (" ", "-", "+") and not line.startswith(("--- ", "diff ")):
            if line[0] in (" ", "-"):
                current[2] += line[1:]
            if line[0] in (" ", "+"):
                current[3] += line[1:]
    return [tuple(h) for h in hunks]


def _call(name: str, arguments: dict) -> dict:
    return {"role": "assistant", "content": "<tool_call>" + json.dumps({"name": name, "arguments": arguments})
                                            + "</tool_call>"}


def repository_reference_turns(hidden: dict) -> list[dict]:
    """A repository task solved the way an agent works (SWE-agent's loop): look around, run the failing tests, read
    each file the fix touches a window at a time, edit it hunk by hunk with str_replace (the gold patch's), run
    the tests again, submit. One tool call per turn; the tool results come from the session, never from here."""
    fail_to_pass = list(hidden.get("FAIL_TO_PASS") or [])
    hunks = _hunks(hidden["patch"])
    paths = list(dict.fromkeys(path for path, *_ in hunks))
    failing = " ".join(shlex.quote(test) for test in fail_to_pass[:5])
    calls = [("bash", {"command": "ls"}), ("str_replace_editor", {"command": "view", "path": "."}),
             ("bash", {"command": f"python -m pytest -q -x {failing} 2>&1 | tail -30"})]
    for path in paths:
        calls.append(("bash", {"command": f"wc -l {shlex.quote(path)}"}))
        last = max(start + new.count("\n") for p, start, _, new in hunks if p == path)
        calls += [("str_replace_editor", {"command": "view", "path": path,
                                          "view_range": [first, first + REFERENCE_WINDOW - 1]})
                  for first in range(1, last + 1, REFERENCE_WINDOW)]
    for path, start, old, new in hunks:
        first_line = old.strip().splitlines()[0][:60] if old.strip() else ""
        calls.append(("bash", {"command": f"grep -nF -e {shlex.quote(first_line)} {shlex.quote(path)}"
                               if first_line else f"head -n {start + 3} {shlex.quote(path)} | tail -n 6"}))
        calls.append(("str_replace_editor", {"command": "str_replace", "path": path, "old_str": old, "new_str": new}))
        calls.append(("str_replace_editor", {"command": "view", "path": path,
                                             "view_range": [max(1, start - 2), start + new.count("\n") + 2]}))
    calls += [("bash", {"command": f"python -m pytest -q {failing} 2>&1 | tail -5"}),
              ("bash", {"command": "python -m pytest -q 2>&1 | tail -5"}), ("submit", {})]
    return [_call(name, arguments) for name, arguments in calls]


REPAIR_VIEW_MARGIN = 3  # lines the repair reference views on each side of the line it fixes, in a long file
# A file this short is viewed whole: a window around the bug is chosen knowing where the bug is, which the policy
# does not (SmolLM2, cold-started on such windows, viewed lines 1-2 of five and wrote an old_str from memory).
REPAIR_VIEW_WHOLE = 40


def minimal_edit(before: str, after: str) -> tuple[str, str, int]:
    """(old_str, new_str, line) of the smallest str_replace turning `before` into `after`: the changed text without
    what both share around it, widened to whole whitespace-separated words, then a word at a time on either side
    until old_str occurs once in `before` (`line`: where it starts)."""
    prefix = 0
    while prefix < min(len(before), len(after)) and before[prefix] == after[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(before), len(after)) - prefix and before[-1 - suffix] == after[-1 - suffix]:
        suffix += 1
    start, end = prefix, len(before) - suffix  # before[start:end] becomes after[start:len(after) - suffix]
    while True:
        while start > 0 and not before[start - 1].isspace():
            start -= 1
        while end < len(before) and not before[end].isspace():
            end += 1
        if before[start:end].strip() and before.count(before[start:end]) == 1 or (start == 0 and end == len(before)):
            break
        while start > 0 and before[start - 1].isspace():  # the next word out on each side
            start -= 1
        while end < len(before) and before[end].isspace():
            end += 1
    new_end = end - len(before) + len(after)
    return before[start:end], after[start:new_end], before[:start].count("\n") + 1


def line_edit(before: str, after: str) -> tuple[str, str, int]:
    """(old_str, new_str, line) of a str_replace of the whole lines that change, without the first one's
    indentation: the line as the view just showed it, one token changed. A small model learns to copy a line it has
    read; it did not learn which fragment is unique in a file (SmolLM2, cold-started on minimal_edit's fragments,
    wrote old_str "1)" where the line read "6)", and the edit found nothing to replace). The indentation is kept
    where the text without it occurs elsewhere in the file; minimal_edit where even the whole lines do."""
    old_lines, new_lines = before.split("\n"), after.split("\n")
    start = 0
    while start < min(len(old_lines), len(new_lines)) and old_lines[start] == new_lines[start]:
        start += 1
    old_end, new_end = len(old_lines), len(new_lines)
    while old_end > start and new_end > start and old_lines[old_end - 1] == new_lines[new_end - 1]:
        old_end, new_end = old_end - 1, new_end - 1
    old, new = "\n".join(old_lines[start:old_end]), "\n".join(new_lines[start:new_end])
    indent = len(old) - len(old.lstrip())
    if old.strip() and new[:indent] == old[:indent] and before.count(old[indent:]) == 1:
        return old[indent:], new[indent:], start + 1
    if old.strip() and before.count(old) == 1:
        return old, new, start + 1
    return minimal_edit(before, after)


def repair_reference_turns(inputs: dict, hidden: dict) -> list[dict] | None:
    """A repair task solved the way the loop goes (a template offering run_tests): run the tests, view the file (the
    lines around the bug in a long one), replace the lines that change (line_edit), run the tests again, submit. None
    for a gold patch of more than one file (the repair tasks' patches change one)."""
    hunks = _hunks(hidden["patch"])
    paths = {path for path, *_ in hunks}
    if len(paths) != 1 or not isinstance(inputs.get("repository"), dict):
        return None
    path = paths.pop()
    before = snapshot_contents(inputs["repository"])[path].decode("utf-8")
    after = before
    for _, _, old, new in hunks:
        if after.count(old) != 1:
            return None
        after = after.replace(old, new)
    old_str, new_str, line = line_edit(before, after)
    lines = max(1, len(before.splitlines()))
    view = {"command": "view", "path": path}
    if lines > REPAIR_VIEW_WHOLE:
        view["view_range"] = [max(1, line - REPAIR_VIEW_MARGIN),
                              min(lines, line + old_str.count("\n") + REPAIR_VIEW_MARGIN)]
    calls = [("run_tests", {}), ("str_replace_editor", view),
             ("str_replace_editor", {"command": "str_replace", "path": path, "old_str": old_str, "new_str": new_str}),
             ("run_tests", {}), ("submit", {})]
    return [_call(name, arguments) for name, arguments in calls]


def reference_turns(*, tools: Sequence[ToolSpec], inputs: dict, hidden: dict, rng: random.Random,
                    tool_call_fraction: float = 0.3) -> list[dict] | None:
    """The assistant's side of a right answer, from the hidden fields the demo's task families use:
    `canonical_solution` / `reference_script` (code), `citations` with `answer` (document QA), `working`
    with `answer` (word problems), a gold `patch` (a repository task: repair_reference_turns for a template offering
    run_tests, repository_reference_turns for one offering bash and the editor), a generated
    task's entry (its answer where the generated tasks' convention puts it: workers/verifiers/generated.py), or a
    bare `answer`. None when the instance has none of them."""
    if is_generated(hidden):
        answer = hidden["entry"].get("answer")
        return None if answer is None else [{"role": "assistant", "content": answer_response(str(answer))}]
    tool_names = {tool.name for tool in tools}
    if hidden.get("patch") and "run_tests" in tool_names:
        return repair_reference_turns(inputs, hidden)
    if hidden.get("patch") and SWE_TOOL_NAMES <= tool_names:
        return repository_reference_turns(hidden)
    code = hidden.get("canonical_solution") or hidden.get("reference_script")
    if code:
        answer = _code_block(code)
        if "run_python" in tool_names and rng.random() < tool_call_fraction:
            call, _, expected = (inputs.get("example") or "").partition(" == ")
            probe = f"{code.rstrip()}\nprint({call})" if call else code
            output = f"exit code 0\nstdout:\n{expected}\n" if call else "exit code 0\nstdout:\n"
            return [{"role": "assistant", "content": "<tool_call>" + json.dumps(
                        {"name": "run_python", "arguments": {"code": probe}}) + "</tool_call>"},
                    {"role": "tool", "content": output}, {"role": "assistant", "content": answer}]
        return [{"role": "assistant", "content": answer}]
    if hidden.get("citations") and "answer" in hidden:
        citation = hidden["citations"][0]
        answer = json.dumps({"answer": str(hidden["answer"]),
                             "citations": [{"doc_id": c["doc_id"], "quote": c["span"]} for c in hidden["citations"]]})
        if "search_documents" in tool_names and rng.random() < tool_call_fraction:
            query = " ".join(citation["span"].split()[:3])
            return [{"role": "assistant", "content": "<tool_call>" + json.dumps(
                        {"name": "search_documents", "arguments": {"query": query}}) + "</tool_call>"},
                    {"role": "tool", "content": f"{citation['doc_id']}: {citation['span']}"},
                    {"role": "assistant", "content": answer}]
        return [{"role": "assistant", "content": answer}]
    if "working" in hidden and "answer" in hidden:
        return [{"role": "assistant", "content": f"{hidden['working']}\nAnswer: {hidden['answer']}"}]
    # An expression to compute with the tool (the real-model demo's smol-tools): the call its examples show, the
    # result, then the number. rng is drawn only here, so other templates' draws stay as they were.
    if (isinstance(inputs.get("expression"), str) and "run_python" in tool_names and "answer" in hidden
            and rng.random() < tool_call_fraction):
        call = json.dumps({"name": "run_python", "arguments": {"code": f"print({inputs['expression']})"}})
        return [{"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                {"role": "tool", "content": str(hidden["answer"])},
                {"role": "assistant", "content": str(hidden["answer"])}]
    if "answer" in hidden:
        return [{"role": "assistant", "content": str(hidden["answer"])}]
    return None


def corrupt(text: str, rng: random.Random) -> str:
    """The same answer with one of its numbers off by a little (or by ten)."""
    numbers = list(NUMBER.finditer(text))
    if not numbers:
        return text
    match = rng.choice(numbers)
    value = max(0, int(match.group()) + rng.choice([-3, -2, -1, 1, 2, 3, 10, -10]))
    return text[:match.start()] + str(value) + text[match.end():]


def pretraining_example(*, prompt: str, turns: list[dict], rng: random.Random, wrong_fraction: float) -> str:
    """One rendered conversation; with probability wrong_fraction its final answer is corrupted."""
    ids, _ = _noisy_conversation(prompt, turns, rng, wrong_fraction)
    return CharChat().tokenizer.decode(ids)


def _noisy_conversation(prompt: str, turns: list[dict], rng: random.Random, wrong_fraction: float,
                        chat: CharChat | None = None) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one conversation, its final answer corrupted with probability wrong_fraction. The
    mask covers the assistant's characters (its end-of-turn mark included): what the model writes."""
    chat = chat or CharChat()
    turns = [dict(t) for t in turns]
    if rng.random() < wrong_fraction:
        turns[-1]["content"] = corrupt(turns[-1]["content"], rng)
    ids, mask = [], []
    for message in [{"role": "user", "content": prompt}, *turns]:
        part = chat.tokenizer.encode(chat.render([message]))
        ids += part
        mask += [int(message["role"] == "assistant")] * len(part)
    return ids, mask


def pretrain(conversations, *, seconds: float = 60.0, steps: int | None = None, seed: int = 0,
             wrong_fraction: float = 0.5, block_size: int = 512, short_fraction: float = 0.8,
             short_batch: int = 128, long_batch: int = 8, lr: float = 3e-3, progress=None) -> tuple[TinyLM, dict]:
    """Pretrain a TinyLM on `conversations`, a list of (prompt, reference turns), for `seconds` (or `steps`).

    Each step is a batch of freshly noised whole conversations, the loss on what the assistant writes (the
    prompts are mostly unpredictable digits and specs; learning them would spend the model's few parameters on
    noise). Short conversations (`12+7=`) go in wide cheap batches, most steps (`short_fraction`); long ones
    (code, JSON, scripts) in small batches, cut to their last `block_size` characters as rollouts cut prompts."""
    if not conversations:
        raise ValueError("no conversations to pretrain on")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    chat = CharChat()
    model = TinyLM(ModelConfig(vocab_size=chat.tokenizer.vocab_size, block_size=block_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    short, long = [], []
    for conversation in conversations:
        prompt, turns = conversation
        (short if len(prompt) + sum(len(t["content"]) for t in turns) <= SHORT_EXAMPLE_CHARS else long).append(
            conversation)
    started, step, losses = time.monotonic(), 0, []

    def batch(pool, size):
        rows = [_noisy_conversation(*rng.choice(pool), rng, wrong_fraction, chat) for _ in range(size)]
        rows = [(ids[-block_size:], mask[-block_size:]) for ids, mask in rows]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((size, width), chat.end)
        mask = torch.zeros(size, width)
        for row, (row_ids, row_mask) in enumerate(rows):
            ids[row, :len(row_ids)] = torch.tensor(row_ids)
            mask[row, :len(row_mask)] = torch.tensor(row_mask, dtype=torch.float)
        return ids, mask

    model.train()
    while (steps is None and time.monotonic() - started < seconds) or (steps is not None and step < steps):
        use_short = short and (not long or rng.random() < short_fraction)
        ids, mask = batch(short, short_batch) if use_short else batch(long, long_batch)
        logits, _ = model(ids[:, :-1])  # (B, T-1, vocab)
        per_token = F.cross_entropy(logits.reshape(-1, chat.tokenizer.vocab_size), ids[:, 1:].reshape(-1),
                                    reduction="none")
        target_mask = mask[:, 1:].reshape(-1)
        loss = (per_token * target_mask).sum() / target_mask.sum().clamp(min=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step += 1
        if progress and step % 25 == 0:
            progress(step, losses[-1], time.monotonic() - started)
    return model.eval(), {"steps": step, "seconds": round(time.monotonic() - started, 1),
                          "first_loss": losses[0], "last_loss": sum(losses[-20:]) / len(losses[-20:]),
                          "conversations": len(conversations), "short": len(short), "long": len(long)}

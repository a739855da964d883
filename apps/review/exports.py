"""Datasets from review labels: what people said about trajectories, turned into training data.

- `sft`: the conversations reviewers judged acceptable (question `question` answered `accept`, or so decided by
  an adjudicator), as chat messages: {"messages": [...]} — what TRL's SFTTrainer and `datasets` read.
- `preference`: pairs from one GRPO group (the same run and task draw): chosen = an accepted trajectory, rejected =
  a sibling that was labelled otherwise, or, unlabelled, scored a lower reward: {"prompt", "chosen", "rejected"}.
- `hacks`: confirmed reward hacks (labelled reward-hack) as negatives: {"prompt", "response", "verifier"}.

Every row carries its provenance: the trajectory, run, template and verifier versions, the policy version, the
labels (each reviewer's current revision: reviewer, answers, revision number), the gold answer if any, and the
queue's agreement on the question. Written as JSONL, Parquet (pyarrow) or a Hugging Face `datasets` directory
(save_to_disk). The tasks of the project's eval suites are left out (`exclude_tasks`, from apps/evals): a dataset
trained on must not hold what a leaderboard measures.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from django.db.models import Q

from apps.registry.models import Version
from apps.trajectories.models import Trajectory
from workers.definitions.specs import ToolSpec
from workers.rl.tasks.overlap import task_label

from .agreement import queue_agreement
from .models import Adjudication, Label, ReviewQueue

KINDS = ("sft", "preference", "hacks")
FORMATS = ("jsonl", "parquet", "hf")
HACK = "reward-hack"


def conversation(trajectory: Trajectory) -> list[dict]:
    """The trajectory's messages as chat messages (role, content): what an SFT row holds."""
    return [{"role": turn["role"], "content": turn.get("content", "")} for turn in trajectory.turns or []
            if turn.get("role") in ("system", "user", "assistant", "tool")]


def offered_tools(trajectories) -> dict[str, list[dict]]:
    """The tool schemas each trajectory's task template offered, by template version ("task_template/SLUG@N", as
    trajectories name it): a row carries them (`tools`) so that training renders the context the policy sampled
    in — the tools' instructions in its system message. Trained on the turns alone, SmolLM2 answered a repair
    task's prompt, with those instructions before it, by copying a tool's schema instead of calling it."""
    wanted: dict[tuple[str, int], str] = {}
    for trajectory in trajectories:
        definition, _, number = trajectory.template.partition("@")
        kind, _, slug = definition.partition("/")
        if kind == "task_template" and number.isdigit():
            wanted[(slug, int(number))] = trajectory.template
    if not wanted:
        return {}
    versions = Q()
    for slug, number in wanted:
        versions |= Q(definition__slug=slug, number=number)
    projects = {trajectory.project_id for trajectory in trajectories}
    # As the function schemas a rollout renders (ToolSpec.function).
    return {wanted[(version.definition.slug, version.number)]:
            [ToolSpec.model_validate(tool).function() for tool in version.spec.get("tools") or []]
            for version in Version.objects.filter(versions, definition__kind="task_template",
                                                  definition__project_id__in=projects)
            .select_related("definition").only("number", "spec", "definition__slug")}


def with_tools(row: dict, trajectory: Trajectory, tools: dict[str, list[dict]]) -> dict:
    """`row` with the tools its trajectory's template offered (none: the row as it is)."""
    offered = tools.get(trajectory.template)
    return {**row, "tools": offered} if offered else row


def prompt_and_completion(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the prompt: everything before the first assistant turn, the completion: the rest)."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return messages[:first], messages[first:]


def dataset_rows(queue: ReviewQueue, *, kind: str, question: str = "verdict", accept: str = "correct",
                 exclude_tasks: frozenset = frozenset()) -> list[dict]:
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    labels = defaultdict(list)
    for label in (Label.objects.whole().current().filter(item__queue=queue, item__removed=False)
                  .select_related("reviewer", "item")):
        labels[label.item.trajectory_id].append(label)
    gold = {(a.item.trajectory_id, a.question): a.answer
            for a in Adjudication.objects.filter(item__queue=queue).select_related("item")}
    alpha = next((a.alpha for a in queue_agreement(queue, samples=200) if a.question == question), None)
    trajectories = {t.pk: t for t in Trajectory.objects.filter(pk__in=labels).select_related("run")}
    exclude_trajectories = {pk for pk, t in trajectories.items() if task_label(t.template, t.task_key) in exclude_tasks}

    def decided(trajectory_id) -> str | None:
        """The gold answer, else the answer every reviewer gave, else None (no label, or reviewers differ)."""
        if (trajectory_id, question) in gold:
            return gold[(trajectory_id, question)]
        answers = {str(label.answers.get(question)) for label in labels[trajectory_id]}
        return answers.pop() if len(answers) == 1 else None

    def provenance(trajectory: Trajectory) -> dict:
        own = labels[trajectory.pk]
        return {"trajectory": str(trajectory.pk), "run": str(trajectory.run_id), "template": trajectory.template,
                "verifier": trajectory.verifier, "task_key": trajectory.task_key,
                "policy_version": trajectory.policy_version, "reward": trajectory.reward,
                "labels": [{"reviewer": label.reviewer.username, "answers": label.answers,
                            "rubric": label.rubric_id, "revision": label.revision} for label in own],
                "reviewers": sorted({label.reviewer.username for label in own}),
                "gold": gold.get((trajectory.pk, question)), "queue": queue.slug, "agreement_alpha": alpha}

    rows = []
    chosen = [t for pk, t in trajectories.items() if pk not in exclude_trajectories and decided(pk) == accept]
    tools = offered_tools(trajectories.values())
    if kind == "sft":
        rows = [with_tools({"messages": conversation(t), "provenance": provenance(t)}, t, tools) for t in chosen]
    elif kind == "hacks":
        for pk, trajectory in trajectories.items():
            if pk in exclude_trajectories or decided(pk) != HACK:
                continue
            prompt, completion = prompt_and_completion(conversation(trajectory))
            rows.append({"prompt": prompt, "response": completion, "verifier": trajectory.verifier,
                         "provenance": provenance(trajectory)})
    else:
        groups = defaultdict(list)  # (run, draw) -> the group's trajectories, read in one query
        draws = Q()
        for trajectory in chosen:
            draws |= Q(run_id=trajectory.run_id, seq=trajectory.seq)
        for member in Trajectory.objects.filter(draws) if chosen else []:
            if task_label(member.template, member.task_key) not in exclude_tasks:
                groups[(member.run_id, member.seq)].append(member)
        for trajectory in chosen:
            for sibling in groups[(trajectory.run_id, trajectory.seq)]:
                if sibling.pk == trajectory.pk:
                    continue
                verdict = decided(sibling.pk) if sibling.pk in labels else None
                worse = verdict not in (None, accept) or (
                    verdict is None and sibling.reward is not None and trajectory.reward is not None
                    and sibling.reward < trajectory.reward)
                if not worse:
                    continue
                prompt, good = prompt_and_completion(conversation(trajectory))
                _, bad = prompt_and_completion(conversation(sibling))
                rows.append(with_tools({"prompt": prompt, "chosen": good, "rejected": bad,
                                        "provenance": {"chosen": provenance(trajectory), "rejected": str(sibling.pk),
                                                       "rejected_by": "label" if verdict else "reward",
                                                       "rejected_reward": sibling.reward}}, trajectory, tools))
    return rows


def write_dataset(rows: list[dict], out: Path, *, fmt: str) -> Path:
    """Write rows as JSONL, Parquet or a Hugging Face datasets directory; returns what was written."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        partial = out.with_name(out.name + ".partial")
        with partial.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        partial.rename(out)  # whole or not at all
        return out
    # Provenance and tools are nested and vary by row: kept as one JSON string per row in the columnar formats (as
    # TRL's datasets keep tools; the studio's data files read either).
    flat = [{**row, **{key: json.dumps(row[key], ensure_ascii=False) for key in ("provenance", "tools") if key in row}}
            for row in rows]
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(flat), out)
        return out
    from datasets import Dataset

    Dataset.from_list(flat).save_to_disk(str(out))
    return out

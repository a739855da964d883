"""Verification figures on the demo mix: verdicts per second per layer, and how much the layering saves —
the fraction of samples decided before the judge, and judge calls avoided versus judging every sample.

The demo is seeded inside a transaction that is rolled back, so this runs against any database. Responses are
made from the tasks' own hidden references: right ones, wrong ones, and ones a cheap check cannot settle.
Without JUDGE_BASE_URL the judge layer cannot grade; it still counts as a judge call wherever it ran.
"""

import io
import json
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

from django.core.management import call_command
from django.db import transaction

from apps.accounts.models import Project
from apps.common import wiring
from apps.registry.models import InstanceSetMember
from apps.registry.pins import pinned_template
from workers.verifiers import Item, Sample, verify


class _Rollback(Exception):
    pass


def _arithmetic(hidden):
    answer = hidden["answer"]
    return [f"Answer: {answer}", f"Answer: {answer + 1}", f"Let me think. {answer // 2} + {answer - answer // 2} "
            f"makes {answer}."]


def _coding(hidden):
    return [f"```python\n{hidden['canonical_solution']}```",
            f"```python\ndef {hidden['entry_point']}(*args, **kwargs):\n    return None\n```"]


def _docqa(hidden):
    quotes = [{"doc_id": c["doc_id"], "quote": c["span"]} for c in hidden["citations"]]
    return [json.dumps({"answer": hidden["answer"], "citations": quotes}),
            json.dumps({"answer": "999 million", "citations": quotes}),
            json.dumps({"answer": hidden["answer"], "citations": [{"doc_id": quotes[0]["doc_id"],
                                                                   "quote": "Revenue doubled in every quarter."}]})]


MIX = {"add-two": (_arithmetic, 12), "multi-step": (_arithmetic, 8), "python-functions": (_coding, 8),
       "cite-figures": (_docqa, 10)}


def _samples(template, make, count):
    members = list(InstanceSetMember.objects.filter(instance_set_id=template.instance_set_id)
                   .select_related("instance").order_by("key"))
    for member in members[::max(1, len(members) // count)][:count]:  # spread over the set's families
        item = Item(key=member.key, inputs=member.instance.inputs, hidden=member.instance.hidden)
        for response in make(item.hidden):
            yield item, Sample(response=response, trajectory_id=f"bench-{member.key}-{hash(response)}")


def run(*, backend: str | None = None, **_) -> dict:
    verdicts, elapsed = [], 0.0
    try:
        with transaction.atomic():
            call_command("seed_demo", stdout=io.StringIO())
            project = Project.objects.get(slug="demo")
            pool = wiring.sandbox_pool(backend=backend)
            try:
                for slug, (make, count) in MIX.items():
                    pinned = pinned_template(project=project, text=slug)
                    context = wiring.verification_context(pool=pool, image=pinned.image)
                    pool.warm(pinned.image, 2)
                    work = list(_samples(pinned.template, make, count))
                    judge_layers = {layer.name for layer in pinned.verifier_spec.layers if layer.kind == "judge"}
                    started = time.perf_counter()
                    with ThreadPoolExecutor(max_workers=2) as workers:
                        def verify_one(pair, spec=pinned.verifier_spec, context=context):
                            return verify(spec, pair[1], pair[0], context)

                        for verdict in workers.map(verify_one, work):
                            verdicts.append((slug, verdict, bool(judge_layers & set(verdict.layers_run))))
                    elapsed += time.perf_counter() - started
            finally:
                pool.close()
            raise _Rollback
    except _Rollback:
        pass

    per_layer = defaultdict(list)
    for _, verdict, _ in verdicts:
        for component in verdict.components:
            per_layer[component.layer].append(component.latency_ms)
    judged = sum(1 for _, _, used_judge in verdicts if used_judge)
    return {
        "samples": len(verdicts), "seconds": round(elapsed, 2),
        "verdicts_per_second": round(len(verdicts) / elapsed, 1),
        "per_layer": {layer: {"checks": len(ms), "mean_ms": round(sum(ms) / len(ms), 2),
                              "checks_per_second_one_worker": round(1000 * len(ms) / sum(ms), 1)}
                      for layer, ms in sorted(per_layer.items())},
        "by_template": {slug: dict(Counter(v.status for s, v, _ in verdicts if s == slug)) for slug in MIX},
        "decided_before_judge": round(1 - judged / len(verdicts), 3),
        "judge_calls": judged, "judge_calls_if_judging_every_sample": len(verdicts),
        "judge_calls_avoided": round(1 - judged / len(verdicts), 3),
        "judge_configured": wiring.judge_client() is not None,
    }

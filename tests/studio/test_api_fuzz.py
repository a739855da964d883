"""Schemathesis fuzzing of the REST API from its own OpenAPI document (/api/v1/openapi.json), in process: every
operation, with cases that fit the schema (positive) and cases that break it (negative), sent to the studio's
WSGI application with a real API token on a project with content — the registry fixture's definitions of every
kind and two runs — so the cases reach the real handlers, not only 404s:

- as a member (an editor's write token): path parameters are the project's real slug, kinds, slugs, version
  references, alias names, run ids, review queue and items (and, in a smaller pass, whatever schemathesis
  generates for them); half the bodies name what exists (a bundle, config fields with values at and past
  their bounds, a spec of the definition's kind, a version, a rubric, answers), so the cases get past the body
  schema into the services;
- as the owner with an admin token, briefly (the audit log is theirs only);
- as an outsider (the owner of another project, with a token for theirs) on the same real paths.

What must hold for every response: no status of 500 or more, and every status of 400 or more is the API's JSON
error (Content-Type application/json, a "detail"). The outsider never gets a 2xx for our project and changes
nothing in it.

The budget is seeded and bounded (Hypothesis derandomized, PASSES examples per operation and pass), so a run
makes the same calls every time: about 1,050 calls in under a minute on two cores (FUZZ_EXAMPLES=2 doubles
it). The summary line is printed even under -q.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from cryptography.fernet import Fernet
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core import NotSet

from apps.accounts.models import AuditEvent, Project
from apps.datasets.services import dataset_build, dataset_upload
from apps.evals.services import endpoint_create, evaluation_launch
from apps.registry.models import Alias, Version
from apps.registry.services import alias_move, version_publish
from apps.review.services import item_next, label_submit, queue_create
from apps.runs.models import Checkpoint, Run
from apps.runs.services import run_create
from apps.sso.services import mapping_set
from apps.trajectories.models import Trajectory
from apps.trajectories.services import trajectories_record
from tests.support.specimens import DOMAIN_SPEC, IMAGE_SPEC, RUBRIC, TEMPLATE_SPEC, VERIFIER_SPEC
from workers.rl.config import BOUNDS, CONFIGS
from workers.rl.types import Trajectory as EngineTrajectory
from workers.rl.types import TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict

SCALE = float(os.environ.get("FUZZ_EXAMPLES", "1"))
# (identity, generation mode, path parameters) -> examples per operation
PASSES = [
    ("member", GenerationMode.POSITIVE, "real", 25),
    ("member", GenerationMode.NEGATIVE, "real", 20),
    ("member", GenerationMode.NEGATIVE, "generated", 6),
    ("owner", GenerationMode.POSITIVE, "real", 4),  # an admin token: the audit log too
    ("outsider", GenerationMode.POSITIVE, "real", 8),
    ("outsider", GenerationMode.NEGATIVE, "real", 5),
]
DEFINITIONS = [("sandbox_image", "py-basic"), ("verifier", "numeric"), ("task_template", "add-two"),
               ("domain", "arithmetic"), ("bundle", "arith-bundle"), ("dataset", "uploaded")]
CONFIG_DEFAULTS = {name: value for cls in CONFIGS.values() for name, value in cls().to_dict().items()}
CONFIG_FIELDS = sorted(CONFIG_DEFAULTS)  # every kind's: a run of one kind is refused another's
SPECIMENS = {"sandbox_image": IMAGE_SPEC, "verifier": VERIFIER_SPEC, "task_template": TEMPLATE_SPEC,
             "domain": DOMAIN_SPEC, "bundle": {"members": ["domain/arithmetic@latest"]}}


@pytest.fixture
def api_schema(settings):
    # Runs started by the fuzz are only queued: no Celery task goes to a broker another test's worker could take.
    settings.EMBEDDED = True
    from django.core.handlers.wsgi import WSGIHandler

    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", WSGIHandler())


def real_path_parameters(operation, world) -> st.SearchStrategy[dict]:
    """The operation's path parameters, drawn from what exists in the project."""
    run_ids, item_ids = world["runs"], world["items"]
    names = {parameter.name for parameter in operation.path_parameters}
    path = operation.path
    kind_in_path = next((kind for kind, _ in DEFINITIONS if f"/definitions/{kind}/" in path), None)
    if kind_in_path:  # a kind's own operation (its publish, a template's instances)
        kinds_slugs = st.sampled_from([pair for pair in DEFINITIONS if pair[0] == kind_in_path] or
                                      [(kind_in_path, "nope")])
    elif "/bundles/{slug}" in path:
        kinds_slugs = st.just(("bundle", "arith-bundle"))
    elif "/verifiers/{slug}" in path:  # review's calibration and canaries: a verifier's slug, not any kind's
        kinds_slugs = st.just(("verifier", "numeric"))
    else:
        kinds_slugs = st.sampled_from(DEFINITIONS)
    choices = {
        "project": st.just("acme-rl"),
        "ref": st.sampled_from(["1", "latest", "stable", "2", "999999999"]),
        "name": st.sampled_from(["stable", "canary", "latest"]),
        "run_id": st.sampled_from(run_ids),
        "queue": st.sampled_from(["check", "check", "nope"]),
        "item_id": st.sampled_from([*item_ids, 999_999]),
        "label_id": st.sampled_from([*world["labels"], 999_999]),
        "evaluation": st.sampled_from([*world["evaluations"], 999_999]),
        "a": st.sampled_from(world["evaluations"]),
        "b": st.sampled_from([*world["evaluations"], 999_999]),
        "endpoint": st.sampled_from(["local", "nope"]),
        "mapping_id": st.sampled_from([*world["mappings"], 999_999]),
    }
    unknown = names - set(choices) - {"kind", "slug", "action"}
    assert not unknown, f"{operation.label}: no real values for the path parameters {unknown}"

    def assemble(kind_slug, rest):
        values = {name: rest[name] for name in names if name in rest}
        if "kind" in names:
            values["kind"] = kind_slug[0]
        if "slug" in names:
            values["slug"] = kind_slug[1]
        return values  # "action" is left to the generator (its enum, or anything in negative cases)

    return st.tuples(kinds_slugs, st.fixed_dictionaries(choices)).map(lambda pair: assemble(*pair))


JSON = st.recursive(st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)


MODELS = ["builtin:demo-tiny", "builtin:nope", "/etc", "/", "../models", "models/gpt", "/tmp/\x00", "~/gpt",
          "/proc/self/root", "\x00"]
DEVICES = ["auto", "cpu", "cuda:1", "cuda;rm -rf", "cpu\n", "cuda:99", "cuda:", "CPU", ""]


def config_value(name: str) -> st.SearchStrategy:
    """Values for one config field: the edges of its bounds and beyond, any JSON, and for the model and the
    device the strings that must be refused."""
    default = CONFIG_DEFAULTS[name]
    if name == "model":
        return st.sampled_from(MODELS) | st.text(max_size=20).map(lambda text: "/" + text)
    if name == "device":
        return st.sampled_from(DEVICES) | st.text(max_size=10)
    if name in BOUNDS:
        low, high = BOUNDS[name]
        edges = [low, high, low - 1, high + 1, high * 10**6, float(high) + 0.5, 1e9, -1e9, 0]
        return st.sampled_from(edges) | st.integers(min_value=-(2**63), max_value=2**63 - 1) | JSON
    if isinstance(default, bool):
        return st.booleans() | JSON
    return JSON


def config_overrides() -> st.SearchStrategy[dict]:
    """Run configs that name real config fields (the schema says only "an object"), the model and the device
    most often."""
    names = st.lists(st.sampled_from(CONFIG_FIELDS + ["model", "device"] * 6), max_size=4, unique=True)
    return names.flatmap(lambda chosen: st.fixed_dictionaries({name: config_value(name) for name in chosen}))


def spec_variants(kind: str) -> st.SearchStrategy[dict]:
    """A real spec of the kind (tests/support/specimens.py) as it is, without one of its fields, or with one
    field's value replaced by any JSON: the publish handler's validation, not only the body schema's."""
    spec = SPECIMENS[kind]
    return st.one_of(
        st.just(spec),
        st.sampled_from(sorted(spec)).map(lambda key: {k: v for k, v in spec.items() if k != key}),
        st.tuples(st.sampled_from(sorted(spec)), JSON).map(lambda pair: {**spec, pair[0]: pair[1]}),
    )


def with_real_values(operation, case, data, world) -> None:
    """Half the time, a body or query that names what exists (a bundle, real config fields, a spec of the kind,
    a version number, versions to compare): otherwise nearly every case ends at a 404 or the body schema."""
    label, body = operation.label, case.body if isinstance(case.body, dict) else None
    if not data.draw(st.booleans(), label="real values"):
        return
    if label == "POST /api/v1/projects/{project}/runs" and body is not None:
        body["bundle"] = data.draw(st.sampled_from(["arith-bundle", "arith-bundle@1", "arith-bundle@latest"]))
        body["config"] = data.draw(config_overrides())
    elif label.endswith("/versions") and case.method == "POST" and body is not None:
        kind = next((kind for kind in SPECIMENS if f"/definitions/{kind}/" in label), None)
        if kind:
            body["spec"] = data.draw(spec_variants(kind))
    elif label.endswith("/validate") and body is not None:
        kind = case.path_parameters.get("kind")
        if kind in SPECIMENS:
            body["spec"] = data.draw(spec_variants(kind))
    elif "/aliases/" in label and body is not None:
        body["version"] = data.draw(st.sampled_from([1, 1, 2]))  # every definition has a version 1
    elif label == "POST /api/v1/projects/{project}/review/queues" and body is not None:
        body.update(slug=data.draw(st.sampled_from(["fuzzed", "check", "other"])), rubric="correctness",
                    sampling={"rule": data.draw(st.sampled_from(["random", "stratified", "hack_shaped"])), "n": 3})
        body["reviewers"] = body["adjudicators"] = []
    elif label.endswith("/labels") and body is not None:  # a step label on the item the member labelled
        body.update(answers={"step_ok": data.draw(st.booleans())}, step=0, component="")
    elif label.endswith("/revisions") and body is not None:
        # The editor amends the label they submitted, keeping its verdict: the canary below is made from it.
        case.path_parameters.update(queue="check", **world["labelled"])
        body.update(answers={"verdict": "reward-hack"}, comment=data.draw(st.text(max_size=20)))
    elif label.endswith("/canary"):  # the item whose label says reward-hack
        case.path_parameters.update(queue="check", item_id=world["labelled"]["item_id"])
    elif label.endswith("/adjudication") and body is not None:
        body.update(question="verdict", answer=data.draw(st.sampled_from(["correct", "wrong", 3])))
        # As for endpoints below: the first body with real values names the real queue's labelled item and one of
        # the rubric's labels, so that a 2xx does not depend on the draws (one CI run drew none in 25 examples).
        if not world["adjudicated"]:
            world["adjudicated"] = True
            case.path_parameters.update(queue="check", item_id=world["labelled"]["item_id"])
            body.update(answer="correct")
    elif label == "POST /api/v1/projects/{project}/evals" and body is not None:
        what = data.draw(st.sampled_from([("model", "model/demo-tiny"), ("checkpoint", "live-run@10"),
                                          ("checkpoint", "champion"), ("endpoint", "local")]))
        body.clear()
        body.update({"suite": data.draw(st.sampled_from(["arith-suite", "arith-suite@1", "arith-bundle"])),
                     what[0]: what[1]})
    elif label == "POST /api/v1/projects/{project}/evals/endpoints/" and body is not None:
        body.clear()
        body.update(slug=data.draw(st.sampled_from(["local", "other"])), model="m",
                    base_url=data.draw(st.sampled_from(["http://127.0.0.1:9/v1", "http://169.254.169.254/v1"])),
                    credential=data.draw(st.sampled_from(["", "operator:LOCAL", "SECRET_KEY"])))
        # Only one draw in six names a new slug, an allowed address and a declared credential: the first body with
        # real values is that one, so that a 2xx does not depend on the draws.
        if not world["endpoint_created"]:
            world["endpoint_created"] = True
            body.update(slug="other", base_url="http://127.0.0.1:9/v1", credential="operator:LOCAL")
    elif label == "POST /api/v1/projects/{project}/evals/external/" and body is not None:
        score = data.draw(st.sampled_from([0.5, 1, None, "high", float("1e308")]))
        body.update(label=data.draw(st.sampled_from(["", "org/model", " "])),
                    results={"results": {data.draw(st.sampled_from(["gsm8k", ""])): {"acc,none": score}},
                             "model_name": "fuzzed"})
    elif label == "GET /api/v1/projects/{project}/evals/{evaluation}/results":
        case.query = {**(case.query or {}), "format": data.draw(st.sampled_from(["lm-eval", "jsonl", "csv"]))}
    elif label == "PATCH /api/v1/projects/{project}/evals/endpoints/{endpoint}" and body is not None:
        body.update(credential=data.draw(st.sampled_from(["", "operator:LOCAL", "operator:SECRET_KEY"])))
    elif label == "POST /api/v1/projects/{project}/secrets" and body is not None:
        body.update(name=data.draw(st.sampled_from(["prod", "staging"])), value="sk-fuzzed-key")
    elif label == "POST /api/v1/projects/{project}/sso-mappings" and body is not None:
        # Always a configured provider and a real group: the owner's few calls here must reach a 2xx (an unknown
        # provider and a blank group are refused in tests/apps/sso/test_roles.py).
        body.update(provider="fuzz-idp", group=data.draw(st.sampled_from(["ml-team", "/acme/ml"])))
    elif label == "POST /api/v1/projects/{project}/checkpoints/aliases" and body is not None:
        body.update(name=data.draw(st.sampled_from(["champion", "challenger"])),
                    checkpoint=data.draw(st.sampled_from(["live-run@10", "live-run@latest", "nope@1"])))
    elif label.endswith("/diff"):
        refs = st.sampled_from(["1", "2", "latest", "stable"])
        case.query = {**(case.query or {}), "a": data.draw(refs), "b": data.draw(refs)}


def can_negate(operation, paths: str) -> bool:
    """Whether a negative case exists with these path parameters: something besides fixed paths to break."""
    if paths == "generated":
        return True
    return bool(list(operation.query) or operation.body)


@pytest.fixture
def editor(member):
    return member("editor")


@pytest.fixture
def world(project, registry, owner, studio_run, editor, settings, monkeypatch, egress_loopback):
    """The project's content: a running run with history, a queued one, an alias, a review queue whose reviewer
    and adjudicator is the editor (who has labelled its first item); returns the run ids and the queue's items."""
    alias_move(version=registry["verifier"], name="stable", actor=owner)
    running, _ = studio_run
    queued = run_create(project=project, bundle=registry["bundle"], steps=4, name="queued", actor=owner)
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    # One trajectory of the registry's own task that its verifier passed: labelled a reward hack, it can become a
    # canary (the synthetic run's trajectories name definitions this registry does not have).
    hack = EngineTrajectory(
        id=trajectory_id(str(queued.pk), 0, 0), run_id=str(queued.pk), seq=0, sample=0, domain="arithmetic",
        template=registry["task_template"].ref, task_key="add-00000", task_hash="0" * 64,
        image=registry["sandbox_image"].ref, verifier=registry["verifier"].ref, policy_version=0, step=1,
        prompt_ids=[1], turns=[Turn(role="user", content="0 + 0?"), Turn(role="assistant", content="no 0")],
        status=TrajectoryStatus.OK, reward=1.0, verdict=Verdict(reward=1.0, status="pass", layers_run=["exact"]),
        started_at=1_700_000_000.0, finished_at=1_700_000_001.0)
    trajectories_record(run=queued, attempt=1, trajectories=[hack])
    others = [str(pk) for pk in Trajectory.objects.filter(run=running).values_list("pk", flat=True)[:4]]
    queue = queue_create(project=project, slug="check", rubric=rubric, actor=owner, overlap=2, reviewers=[editor],
                         adjudicators=[editor], sampling={"rule": "list", "trajectories": [hack.id, *others]})
    first = item_next(queue=queue, reviewer=editor)
    label = label_submit(queue=queue, item_id=first.pk, reviewer=editor, answers={"verdict": "reward-hack"})
    # A checkpoint of the running run (its files: one small file), an eval suite over the registry's domain, and a
    # queued evaluation of the built-in model on it.
    saved = Path(settings.DATA_DIR) / "checkpoints" / str(running.pk) / "step-00000010"
    saved.mkdir(parents=True)
    (saved / "model.safetensors").write_bytes(b"0")
    Checkpoint.objects.create(run=running, step=10, path=str(saved), bytes=1)
    model = version_publish(project=project, kind="model", slug="demo-tiny",
                            spec={"source": {"type": "builtin", "name": "demo-tiny"}}, author=owner).version
    suite = version_publish(project=project, kind="bundle", slug="arith-suite", author=owner, spec={
        "members": ["domain/arithmetic@latest"], "evaluation": {"tasks_per_template": 4}}).version
    evaluation = evaluation_launch(project=project, suite=suite, actor=owner, model=model)
    # A dataset built from an upload: its spec pins its rows' hash, known once they are stored, so it joins the
    # specimens here (the same bytes every time: the same spec).
    upload = dataset_upload(project=project, name="rows.jsonl", fmt="sft", actor=owner, content=json.dumps(
        {"messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]}).encode())
    SPECIMENS["dataset"] = dataset_build(project=project, slug="uploaded", fmt="sft", sources=[upload.source()],
                                         actor=owner).version.spec
    # An endpoint on the loopback (allowed, as the demo allows it), a credential the operator declared, and a key
    # for the project's stored secrets.
    monkeypatch.setenv("STUDIO_ENDPOINT_KEY_LOCAL", "local-key")
    settings.SECRETS_KEY = Fernet.generate_key().decode()
    endpoint_create(project=project, slug="local", base_url="http://127.0.0.1:9/v1", model="m", actor=owner)
    # A sign-on provider and a group mapped to a role in the project (apps/sso).
    settings.SIGN_ON_PROVIDERS = {"fuzz-idp": {"name": "Fuzz IdP", "protocol": "oidc", "groups_claim": "groups"}}
    mapping = mapping_set(project=project, provider="fuzz-idp", group="ml-team", role="editor", actor=owner)
    return {"mappings": [mapping.pk], "runs": [str(running.pk), str(queued.pk)],
            "items": list(queue.items.values_list("pk", flat=True)),
            "evaluations": [evaluation.pk], "labels": [label.pk],
            "labelled": {"item_id": first.pk, "label_id": label.pk}, "endpoint_created": False, "adjudicated": False}


def snapshot(project) -> dict:
    return {"versions": Version.objects.filter(definition__project=project).count(),
            "aliases": sorted(Alias.objects.filter(definition__project=project).values_list("name", "version_id")),
            "runs": sorted(Run.objects.filter(project=project).values_list("id", "status", "requested")),
            "audit": AuditEvent.objects.filter(project=project).count()}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # each request commits or fails alone, as in production
def test_fuzz_the_api_from_its_openapi_document(api_schema, world, project, owner, editor, outsider, token_for,
                                                 capsys):
    tokens = {"member": token_for(editor, project=project, scope="write"),
              "owner": token_for(owner, project=project, scope="admin"),
              "outsider": token_for(outsider, project=Project.objects.get(slug="other-team"), scope="write")}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 18, [op.label for op in operations]

    calls: list[dict] = []
    failures: list[str] = []
    skipped: list[str] = []
    started = time.monotonic()
    before_outsider = None
    for identity, mode, paths, examples in PASSES:
        if identity == "outsider" and before_outsider is None:
            before_outsider = snapshot(project)
        for operation in operations:
            if mode == GenerationMode.NEGATIVE and not can_negate(operation, paths):
                continue
            _fuzz(operation, mode, paths, max(1, round(examples * SCALE)), tokens[identity], identity, world,
                  calls, failures, skipped)
    seconds = time.monotonic() - started
    after_outsider = snapshot(project)

    statuses = Counter(call["status"] for call in calls)
    callers = Counter(call["who"] for call in calls)
    digest = hashlib.sha256("\n".join(call["sent"] for call in calls).encode()).hexdigest()[:12]
    summary = (f"{len(operations)} operations, {len(calls)} calls ({dict(callers)}, requests {digest}) in "
               f"{seconds:.1f} s; statuses {dict(sorted(statuses.items()))}; nothing to generate for {len(skipped)} "
               "operation-passes")
    with capsys.disabled():
        print(f"\nAPI fuzz: {summary}")
    assert not failures, summary + "\n" + "\n".join(failures[:30])
    assert after_outsider == before_outsider, "the outsider's calls changed the project"
    # The fuzz reached the handlers: successes, refusals of bodies and of states, not only 404s and 422s.
    assert statuses[200] and statuses[201] + statuses[200] > 50 and statuses[400] and statuses[404] and statuses[422]
    reached = {call["operation"] for call in calls if call["status"] < 300 and call["who"] != "outsider"}
    unreached = sorted({op.label for op in operations} - reached)
    assert not unreached, f"no 2xx at all for {unreached}"


def _fuzz(operation, mode, paths, examples, token, identity, world, calls, failures, skipped):
    fixed = real_path_parameters(operation, world) if paths == "real" else st.just(None)
    run_ids = world["runs"]

    @hypothesis_settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                         phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                         print_blob=False)
    @given(data=st.data())
    def send(data):
        path_parameters = data.draw(fixed, label="path parameters")
        case = data.draw(operation.as_strategy(generation_mode=mode, path_parameters=path_parameters), label="case")
        with_real_values(operation, case, data, world)
        where = f"[{identity} {mode.value} {paths}] {case.method} {case.formatted_path} query={case.query!r} " \
                f"body={_short(case.body)}"
        try:
            response = case.call(headers={"Authorization": f"Bearer {token}"})
        except Exception as exc:  # the transport could not send it: a bug of the test, reported as one
            failures.append(f"{where}: not sent: {type(exc).__name__}: {exc}")
            return
        sent = repr((operation.label, sorted((k, run_ids.index(v) if v in run_ids else v)
                                             for k, v in case.path_parameters.items()), case.query,
                     None if isinstance(case.body, NotSet) else case.body))
        calls.append({"operation": operation.label, "status": response.status_code, "who": identity, "sent": sent})
        problem = _problem(response, identity, case)
        if problem:
            failures.append(f"{where}\n    -> {response.status_code}: {problem}")

    try:
        send()
    except Unsatisfiable:
        skipped.append(f"{identity} {mode.value} {paths} {operation.label}")


def _problem(response, identity, case) -> str | None:
    status, content_type = response.status_code, response.headers.get("content-type", [""])
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    if status >= 500:
        return f"server error: {_short(response.text_lossy())}"
    if status >= 400:
        if not content_type.startswith("application/json"):
            return f"an error that is not JSON ({content_type}): {_short(response.text_lossy())}"
        try:
            body = json.loads(response.content)
        except ValueError:
            return f"an error whose body is not JSON: {_short(response.text_lossy())}"
        if not isinstance(body, dict) or not isinstance(body.get("detail"), str):
            return f"an error without a detail: {_short(body)}"
    if identity == "outsider" and status < 300 and "/projects/acme-rl" in case.formatted_path:
        return f"an outsider read or wrote our project: {_short(response.text_lossy())}"
    return None


def _short(value, limit: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"

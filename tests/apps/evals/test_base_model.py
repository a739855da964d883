"""An evaluation builds the model it scores from the tasks of the bundle that model trains on: the demo's base
model evaluated on the demo's held-out suite is the model the demo run starts from, never one pretrained on the
suite's own tasks (it would have seen the answers it is scored on)."""

from io import StringIO

from django.core.management import call_command

from apps.accounts.models import Project
from apps.evals.services import evaluation_launch
from apps.registry.pins import bundle_tasks
from apps.registry.refs import Ref, parse_ref
from apps.registry.selectors import version_resolve
from apps.runs.attempts.evaluation import model_tasks
from workers.rl.models.build import demo_corpus


def test_the_demo_base_model_on_the_held_out_suite_is_pretrained_from_the_demo_bundle(db):
    call_command("seed_demo", stdout=StringIO())
    project = Project.objects.get(slug="demo")
    suite = version_resolve(project=project, ref=Ref("bundle", "demo-suite"))
    bundle = version_resolve(project=project, ref=Ref("bundle", "demo"))
    model = version_resolve(project=project, ref=parse_ref("model/demo-tiny"))
    evaluation = evaluation_launch(project=project, suite=suite, actor=None, model=model, via="cli")
    config = evaluation.run.run_config
    assert config.evaluation_plan.pretrained_on == bundle.ref  # the bundle whose run_config names the model and suite
    asked = bundle_tasks(bundle=suite)
    built_from = model_tasks(evaluation.run, config.evaluation_plan, asked)
    assert demo_corpus(built_from) == demo_corpus(bundle_tasks(bundle=bundle))
    assert not {prompt for prompt, _ in demo_corpus(asked)} & {prompt for prompt, _ in demo_corpus(built_from)}

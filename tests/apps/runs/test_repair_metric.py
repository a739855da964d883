"""repair/fixed_after_feedback on the run page: a run whose steps and evaluations solved repair tasks charts it in
a panel of its own, beside the other metrics; a run without repair tasks has no such panel."""

import json

from django.urls import reverse

from apps.runs.services import run_step_record
from tests.support.repair import FIX, editor, planted, run_tests
from workers.rl.rollout.feedback import repair_points
from workers.rl.types import trajectory_id

TITLE = "Fixed after feedback (share of solved repair trajectories)"


def _panels(client, project, run) -> dict:
    page = client.get(reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": run.pk}))
    return {panel["key"]: json.loads(panel["figure"]) for panel in page.context["panels"]}


def test_the_run_page_charts_fixed_after_feedback_only_for_a_run_with_repair_tasks(client, owner, project,
                                                                                   studio_run):
    run, attempt = studio_run
    client.force_login(owner)
    assert "repair" not in _panels(client, project, run)  # 30 synthetic steps, no repair trajectory among them

    loop = (run_tests(1), editor("str_replace", diff=FIX), run_tests(0))
    trajectories = [planted(*loop, id=trajectory_id(str(run.pk), 1000, 0), run_id=str(run.pk), seq=1000, step=31),
                    planted(editor("str_replace", diff=FIX), id=trajectory_id(str(run.pk), 1001, 0),
                            run_id=str(run.pk), seq=1001, step=31)]
    run_step_record(run_id=run.pk, attempt=attempt, step=31, wall_time=1_700_000_031.0, trajectories=trajectories,
                    points={"reward/mean": 1.0, **repair_points(trajectories)})
    run_step_record(run_id=run.pk, attempt=attempt, step=31, wall_time=1_700_000_032.0, trajectories=[],
                    points=repair_points(trajectories[:1], prefix="eval/"))

    panels = _panels(client, project, run)
    figure = panels["repair"]
    assert figure["layout"]["title"]["text"] == TITLE and figure["layout"]["yaxis"]["tickformat"] == ".0%"
    assert [trace["meta"] for trace in figure["data"]] == ["eval/repair/fixed_after_feedback",
                                                          "repair/fixed_after_feedback"]
    assert list(panels).index("repair") > list(panels).index("reward")  # among the run's other panels
    history = json.loads(client.get(reverse("runs:run_history", kwargs={"project": project.slug,
                                                                        "run_id": run.pk}) + "?after_step=30").content)
    assert history["series"]["repair/fixed_after_feedback"]["value"] == [0.5]
    assert history["series"]["eval/repair/fixed_after_feedback"]["value"] == [1.0]

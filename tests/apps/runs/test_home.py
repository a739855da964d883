"""The landing page after log-in: what is running in the user's projects, each linked to its live page."""

from django.urls import reverse

from apps.evals.services import evaluation_launch
from apps.registry.services import version_publish
from tests.apps.evals.conftest import SUITE


def test_logging_in_lands_on_what_is_running(client, project, registry, owner, studio_run, outsider):
    run, _ = studio_run
    suite = version_publish(project=project, kind="bundle", slug="arith-suite", spec=SUITE, author=owner).version
    model = version_publish(project=project, kind="model", slug="demo-tiny",
                            spec={"source": {"type": "builtin", "name": "demo-tiny"}}, author=owner).version
    evaluation = evaluation_launch(project=project, suite=suite, actor=owner, model=model)

    page = client.post(reverse("login"), {"username": "olive", "password": "pw-for-tests"}, follow=True)
    assert page.status_code == 200
    html = page.content.decode()
    assert "Running now" in html
    run_page = reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": run.pk})
    assert f'href="{run_page}"' in html and "30 / 100" in html
    eval_page = reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": evaluation.run_id})
    assert f'href="{eval_page}"' in html and "evaluation of model/demo-tiny@1" in html
    # The page is the project's: its navigation is drawn.
    assert f'href="{reverse("runs:run_list", kwargs={"project": project.slug})}"' in html

    # Another user's running work is not theirs to see; with nothing running they land in their registry.
    client.force_login(outsider)
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == reverse(
        "registry:definition_list", kwargs={"project": "other-team"})

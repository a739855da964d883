"""`manage.py serve (--checkpoint RUN@STEP|ALIAS | --model model/SLUG[@N]) [--host 127.0.0.1] [--port 8100]
[--name NAME] [--project SLUG] [--speculative-tokens N]`: an OpenAI-compatible server of a checkpoint or a base model
(workers/rl/serving/app.py: /v1/models, /v1/chat/completions with streaming, /v1/completions, logprobs), on the
torch or transformers engine with continuous batching on the CPU, or vLLM on a GPU as the run's config says.
It also loads new weights on POST /v1/weights, so a GRPO run can generate on it (GRPOConfig.inference_servers): with
STUDIO_SERVE_WEIGHTS_TOKEN set, callers need that bearer token; without it, only loopback clients may.

Point an endpoint at it (`evaluate --endpoint`, or the judge layer's base URL) like at any other server."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.common import wiring
from apps.registry.errors import VersionNotFound
from apps.registry.pins import bundle_tasks
from apps.registry.refs import parse_ref
from apps.registry.selectors import version_resolve
from apps.runs.attempts.evaluation import checkpoint_model
from apps.runs.checkpoints import CheckpointNotFound, checkpoint_resolve
from apps.runs.services import _model_pinned
from workers.rl.config import RolloutConfig


class Command(BaseCommand):
    help = "Serve a checkpoint or a base model behind an OpenAI-compatible API."

    def add_arguments(self, parser):
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--checkpoint", help="RUN@STEP (RUN a name or id; STEP a number or latest) or an alias")
        target.add_argument("--model", help="a model definition: model/SLUG[@N]")
        parser.add_argument("--bundle", help="with --model: the bundle whose tasks the built-in demo model "
                                             "was pretrained on (default: the project's first bundle)")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8100)
        parser.add_argument("--name", help="the model name clients send (default: the checkpoint or model)")
        parser.add_argument("--project", help="project slug (default: the only project)")
        parser.add_argument("--speculative-tokens", type=int, metavar="N",
                            help="speculative decoding from the context on the torch and transformers engines: at "
                                 "most N tokens drafted per row and step, 0 off (default: the run's config's "
                                 "speculative_tokens; a --model, off)")

    def handle(self, *args, checkpoint, model, bundle, host, port, name, project, speculative_tokens, **_):
        import uvicorn

        from workers.rl.serving.app import build_app

        if speculative_tokens is not None and speculative_tokens < 0:
            raise CommandError("--speculative-tokens must be 0 (off) or more")
        overrides = {} if speculative_tokens is None else {"speculative_tokens": speculative_tokens}
        scope = project_for_command(slug=project)
        try:
            if checkpoint:
                found = checkpoint_resolve(project=scope, name=checkpoint)
                built = checkpoint_model(found, overrides=overrides)
                label = name or f"{found.run.name}@{found.step}"
            else:
                definition = version_resolve(project=scope, ref=parse_ref(model))
                from apps.registry.models import Version

                suite = (version_resolve(project=scope, ref=parse_ref(f"bundle/{bundle}")) if bundle else
                         Version.objects.filter(definition__project=scope, definition__kind="bundle")
                         .order_by("definition__slug", "-number").first())
                config = RolloutConfig.resolve(_model_pinned(
                    {"model": definition.ref, "mode": "sync", **overrides}, project=scope, bundle=suite))
                built = wiring.run_model(config, bundle_tasks(bundle=suite))
                label = name or definition.ref
        except (CheckpointNotFound, VersionNotFound, ValueError, FileNotFoundError) as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(f"serving {label} at http://{host}:{port}/v1")
        try:
            uvicorn.run(build_app(engine=built.engine, chat=built.chat, model_name=label,
                                  weights_token=settings.INFERENCE_SERVER_TOKEN), host=host, port=port,
                        log_level="warning")
        finally:
            built.close()

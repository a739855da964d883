"""`manage.py environments serve --bundle SLUG[@N] [--port 8200] [--host 127.0.0.1] [--project SLUG]
[--max-sessions 64] [--max-sessions-per-token 64] [--idle-timeout 300]`: a bundle's environments over OpenEnv's
protocol (apps/environments/server.py), for a trainer elsewhere (TRL, verifiers, verl, OpenEnv's own clients), in a
process of its own as `serve` is. Clients authenticate with a project token of the environment scope; each episode
is recorded as a trajectory of the external run its reset names."""

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.common.errors import StudioError


class Command(BaseCommand):
    help = "Serve a bundle's environments over OpenEnv's protocol to trainers elsewhere."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        serve = actions.add_parser("serve", help="serve a bundle's environments (OpenEnv: /ws, /reset, /step, ...)")
        serve.add_argument("--bundle", required=True, help="bundle SLUG, SLUG@N or SLUG@alias")
        serve.add_argument("--project", help="project slug (default: the only project)")
        serve.add_argument("--host", default="127.0.0.1")
        serve.add_argument("--port", type=int, default=8200)
        serve.add_argument("--max-sessions", type=int, default=64,
                           help="sessions (episodes in play, each holding its sandbox) at once; past it a client "
                                "gets OpenEnv's capacity error at once")
        serve.add_argument("--max-sessions-per-token", type=int, default=64,
                           help="sessions one token may hold at once")
        serve.add_argument("--idle-timeout", type=float, default=300.0,
                           help="seconds a session may go without a call before it is closed, its sandbox given "
                                "back and its unfinished episode recorded as abandoned")

    def handle(self, *args, action, **options):
        getattr(self, f"handle_{action}")(**options)

    def handle_serve(self, *, bundle, project, host, port, max_sessions, max_sessions_per_token, idle_timeout, **_):
        for name, value in (("--max-sessions", max_sessions), ("--max-sessions-per-token", max_sessions_per_token),
                            ("--idle-timeout", idle_timeout)):
            if value <= 0:
                raise CommandError(f"{name} must be more than 0")
        try:
            import uvicorn

            from apps.environments.server import environment_app
        except ModuleNotFoundError as exc:
            raise CommandError(f"{exc.name} is missing: the environment server needs the environments extra "
                               "(pip install -e '.[environments]'; make setup installs it)") from None
        from apps.environments.served import ServedBundle

        try:
            scope = project_for_command(slug=project)
            served = ServedBundle.open(project=scope, bundle=bundle, sessions=max_sessions)
        except (LookupError, StudioError) as exc:
            raise CommandError(str(exc)) from None
        app = environment_app(served, max_sessions=max_sessions, max_sessions_per_token=max_sessions_per_token,
                              idle_timeout=idle_timeout)
        self.stderr.write(f"serving {served.bundle.ref} of {scope.slug} over OpenEnv at http://{host}:{port} "
                          f"(WebSocket /ws; {len(served.tasks.templates)} templates; tokens of the environment "
                          "scope)")
        try:
            uvicorn.run(app, host=host, port=port, log_level="warning")
        finally:
            served.close()

"""`manage.py sandbox exec FILE | pool-status | soak`: run model-style code in a sandbox from the command line."""

import json
import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.common import wiring
from apps.registry.errors import VersionNotFound
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve
from workers.sandbox import DEFAULT_IMAGE, Execution, SandboxImage
from workers.sandbox.backends import BACKENDS
from workers.sandbox.soak import soak


class Command(BaseCommand):
    help = "Run a program in a sandbox, show the running pools, or soak the sandbox machinery."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        run = sub.add_parser("exec", help="run FILE (Python) in a sandbox; prints the result as one JSON object")
        run.add_argument("file", type=Path)
        run.add_argument("--image", help="sandbox image SLUG or SLUG@N (default: a plain Python 3.11 image)")
        run.add_argument("--project", help="project of the image (default: the only project)")
        run.add_argument("--timeout", type=float, help="wall-clock limit in seconds")
        run.add_argument("--memory-mb", type=int, help="memory limit in MB")
        run.add_argument("--backend", choices=BACKENDS, default=None)
        sub.add_parser("pool-status", help="the sandbox pools running on this machine, as JSON")
        soak_parser = sub.add_parser("soak", help="honest and hostile programs mixed; then what leaked, as JSON")
        soak_parser.add_argument("--minutes", type=float, default=10)
        soak_parser.add_argument("--concurrency", type=int, default=4)
        soak_parser.add_argument("--backend", choices=BACKENDS, default=None)

    def handle(self, *args, action, **options):
        getattr(self, "handle_" + action.replace("-", "_"))(**options)

    def handle_exec(self, *, file: Path, image: str | None, project: str | None, timeout: float | None,
                    memory_mb: int | None, backend: str | None, **_):
        try:
            program = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {file}: {exc}")
        sandbox_image = self.image(image, project)
        overrides = {}
        if timeout is not None:
            overrides.update(wall_seconds=timeout, cpu_seconds=min(sandbox_image.limits.cpu_seconds, timeout))
        if memory_mb is not None:
            overrides["memory_mb"] = memory_mb
        if overrides:
            from dataclasses import replace

            sandbox_image = replace(sandbox_image, limits=replace(sandbox_image.limits, **overrides))
        pool = wiring.sandbox_pool(backend=backend)
        try:
            result = pool.execute(sandbox_image, Execution(program=program), timeout=60)
        finally:
            pool.close()
        self.stdout.write(json.dumps(result.to_json()))

    def image(self, text: str | None, project_slug: str | None) -> SandboxImage:
        if text is None:
            return DEFAULT_IMAGE
        try:
            project = project_for_command(slug=project_slug)
            version = version_resolve(project=project, ref=Ref("sandbox_image", *split_slug_ref(text)))
        except (LookupError, VersionNotFound) as exc:
            raise CommandError(str(exc))
        return SandboxImage.from_spec(version.ref, version.spec)

    def handle_pool_status(self, **_):
        pools = []
        for path in sorted(Path(settings.SANDBOX_STATUS_DIR).glob("pool-*.json")):
            try:
                state = json.loads(path.read_text())
                os.kill(state["pid"], 0)
            except (OSError, ValueError):
                path.unlink(missing_ok=True)  # its process is gone
                continue
            pools.append(state)
        self.stdout.write(json.dumps({"pools": pools}, indent=2))

    def handle_soak(self, *, minutes: float, concurrency: int, backend: str | None, **_):
        report = soak(backend=wiring.sandbox_backend(backend), minutes=minutes,
                      concurrency=concurrency, progress=lambda n: self.stderr.write(f"\r{n} executions", ending=""))
        self.stderr.write("")
        self.stdout.write(json.dumps(report, indent=2))

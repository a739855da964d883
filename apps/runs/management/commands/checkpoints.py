"""`manage.py checkpoints list [RUN]` · `checkpoints alias NAME RUN@STEP` · `checkpoints export RUN STEP DIR`:
the checkpoint registry from a shell. `export` writes a Hugging Face-loadable directory (safetensors, config,
tokenizer) of a checkpoint of a run whose model is a Hugging Face one; DIR is a local directory or a folder in an
object store (s3://bucket/exports/NAME, published whole: its files, then its manifest.json)."""

import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.runs.checkpoints import CheckpointNotFound, alias_move, checkpoint_resolve, run_find
from apps.runs.models import Checkpoint, CheckpointAlias
from workers.storage import Storage


class Command(BaseCommand):
    help = "List checkpoints, move an alias, or export a checkpoint as a Hugging Face directory."

    def add_arguments(self, parser):
        parser.add_argument("--project", help="project slug (default: the only project)")
        commands = parser.add_subparsers(dest="command", required=True)
        listing = commands.add_parser("list")
        listing.add_argument("run", nargs="?", help="a run's name or id (default: every run)")
        alias = commands.add_parser("alias")
        alias.add_argument("name")
        alias.add_argument("checkpoint", help="RUN@STEP")
        export = commands.add_parser("export")
        export.add_argument("run")
        export.add_argument("step")
        export.add_argument("directory")

    def handle(self, *args, command, project, **options):
        scope = project_for_command(slug=project)
        try:
            if command == "list":
                return self._list(scope, options.get("run"))
            if command == "alias":
                checkpoint = checkpoint_resolve(project=scope, name=options["checkpoint"])
                alias_move(project=scope, name=options["name"], checkpoint=checkpoint, actor=None, via="cli")
                self.stdout.write(f"{options['name']} -> {checkpoint.run.name}@{checkpoint.step}")
                return
            checkpoint = checkpoint_resolve(project=scope, name=f"{options['run']}@{options['step']}")
            self._export(checkpoint, options["directory"])
        except CheckpointNotFound as exc:
            raise CommandError(str(exc)) from None

    def _list(self, scope, run):
        rows = Checkpoint.objects.filter(run__project=scope).select_related("run").order_by("run__created_at", "step")
        if run:
            rows = rows.filter(run=run_find(project=scope, name=run))
        aliases = {}
        for alias in CheckpointAlias.objects.filter(project=scope):
            aliases.setdefault(alias.checkpoint_id, []).append(alias.name)
        for row in rows:
            names = ", ".join(sorted(aliases.get(row.pk, [])))
            self.stdout.write(f"{row.run.name}@{row.step}\t{row.bytes / 1e6:.1f} MB\t{names}\t{row.path}")

    def _export(self, checkpoint, directory: str):
        config = checkpoint.run.run_config
        if config.model.startswith("builtin:demo-tiny"):
            raise CommandError("the built-in demo model is the studio's own TinyLM, not a Hugging Face model: "
                               "it has no Hugging Face directory to export")
        remote = "://" in directory
        if remote:
            if "/" not in directory.split("://", 1)[1].strip("/"):
                raise CommandError(f"{directory}: name a folder inside the bucket to export to, such as "
                                   "s3://BUCKET/exports/NAME")
            parent, _, name = directory.rstrip("/").rpartition("/")
        from apps.runs.attempts.evaluation import checkpoint_model

        model = checkpoint_model(checkpoint)
        try:
            if remote:  # exported here, then published there whole
                with tempfile.TemporaryDirectory() as staging:
                    model.policy.export(Path(staging))
                    Storage(parent).publish(name, Path(staging), run=str(checkpoint.run_id), step=checkpoint.step)
            else:
                model.policy.export(Path(directory))
        finally:
            model.close()
        self.stdout.write(f"wrote {directory} ({checkpoint.run.name}@{checkpoint.step})")

"""`manage.py review_export QUEUE --kind sft|preference|hacks --out PATH [--format jsonl|parquet|hf]
[--question verdict] [--accept correct] [--project SLUG]`: a dataset from a review queue's labels
(apps/review/exports.py), each row with its provenance."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.http import Http404

from apps.accounts.selectors import project_for_command
from apps.evals.selectors import suite_task_ids
from apps.review.exports import FORMATS, KINDS, dataset_rows, write_dataset
from apps.review.selectors import queue_get


class Command(BaseCommand):
    help = "Export a dataset (SFT, preference pairs or reward-hack negatives) from a review queue's labels."

    def add_arguments(self, parser):
        parser.add_argument("queue")
        parser.add_argument("--kind", choices=KINDS, default="sft")
        parser.add_argument("--format", choices=FORMATS, default="jsonl", dest="fmt")
        parser.add_argument("--out", type=Path, required=True)
        parser.add_argument("--question", default="verdict", help="the rubric question that decides")
        parser.add_argument("--accept", default="correct", help="the answer that makes a trajectory good")
        parser.add_argument("--project", help="project slug (default: the only project)")

    def handle(self, *args, queue, kind, fmt, out, question, accept, project, **_):
        scope = project_for_command(slug=project)
        try:
            review = queue_get(project=scope, slug=queue)
        except Http404 as exc:
            raise CommandError(str(exc)) from None
        rows = dataset_rows(review, kind=kind, question=question, accept=accept,
                        exclude_tasks=suite_task_ids(project=review.project))
        written = write_dataset(rows, out, fmt=fmt)
        self.stdout.write(f"{len(rows)} {kind} rows from queue {review.slug} -> {written} ({fmt})")

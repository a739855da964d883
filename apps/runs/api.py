"""The runs part of the REST API: list and read runs, queue one on a bundle, pause, resume and cancel it, read its
metric history and events. The same roles as the run pages (any member reads; editors start and steer runs), the
same services, and the same audit rows (via "api")."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from ninja import Field, Path, Query, Router, Schema, Status
from pydantic import ConfigDict

from apps.accounts.api_auth import caller_project
from apps.accounts.models import Role
from apps.common.api_errors import READ_ERRORS, WRITE_ERRORS
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve

from . import selectors
from .models import RunStatus
from .services import run_create, run_request

router = Router(tags=["runs"])

RUNS = "/projects/{project}/runs"
RUN = RUNS + "/{run_id}"
BUNDLE_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}(@([1-9][0-9]{0,8}|[a-z][a-z0-9-]{0,62}))?$"


class RunIn(Schema):
    model_config = ConfigDict(extra="forbid")

    bundle: str = Field("", pattern=f"^$|{BUNDLE_PATTERN}",
                        description="the bundle to pin: slug, slug@N or slug@alias (sft and dpo: optional, to train "
                                    "on config.dataset alone with the default settings and config's)")
    steps: int = Field(ge=1, le=1_000_000, description="trainer steps")
    kind: Literal["grpo", "sft", "dpo"] = Field("grpo", description="grpo samples and verifies its own data; sft "
                                                "and dpo train on config.dataset, a dataset version dataset/SLUG@N")
    name: str = Field("", max_length=200, description="default: the bundle's slug and the time")
    config: dict[str, Any] = Field(default_factory=dict,
                                   description="settings of the run's kind to override (GRPOConfig, SFTConfig or "
                                               "DPOConfig in workers/rl/config.py); a setting of another kind is "
                                               "refused (400), naming it and the kinds that have it")


class RunOut(Schema):
    id: UUID
    name: str
    kind: str
    status: str
    requested: str
    step: int
    steps_total: int
    attempt: int
    bundle: str | None = Field(description="the pinned bundle version, kind/slug@N (null: a run on its dataset "
                                           "alone, config.dataset)")
    config_hash: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str

    @staticmethod
    def resolve_bundle(run) -> str | None:
        return run.bundle.ref if run.bundle is not None else None


class RunDetailOut(RunOut):
    config: dict[str, Any]
    summary: dict[str, Any]


class SeriesOut(Schema):
    step: list[int]
    wall_time: list[float]
    value: list[float]


class MetricsOut(Schema):
    series: dict[str, SeriesOut]
    last_step: int | None = Field(description="the newest step with a point (null: none yet)")
    bucket: int = Field(description="steps averaged per point (1: every step)")


class EventOut(Schema):
    id: int
    kind: str
    message: str
    step: int | None
    created_at: datetime



@router.get(RUNS, response={200: list[RunOut], **READ_ERRORS})
def list_runs(request, project: str, status: RunStatus | None = None, limit: int = Query(50, ge=1, le=500)):
    """The project's runs, newest first, optionally of one status."""
    return selectors.run_list(project=caller_project(request, project), status=status)[:limit]


@router.post(RUNS, response={201: RunDetailOut, **WRITE_ERRORS})
def start_run(request, project: str, payload: RunIn):
    """Queue a run on a bundle version (editors). 400 names what is wrong with the bundle, steps or config."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    bundle = (version_resolve(project=scope, ref=Ref("bundle", *split_slug_ref(payload.bundle))) if payload.bundle
              else None)
    run = run_create(project=scope, bundle=bundle, steps=payload.steps, overrides=payload.config, kind=payload.kind,
                     name=payload.name, actor=request.auth, via="api", enqueue=True)
    return Status(201, run)


@router.get(RUN, response={200: RunDetailOut, **READ_ERRORS})
def get_run(request, project: str, run_id: UUID):
    """One run: its state, the resolved config and, once it ends, its summary."""
    return selectors.run_get(project=caller_project(request, project), run_id=run_id)


@router.get(RUN + "/metrics", response={200: MetricsOut, **READ_ERRORS})
def run_metrics(request, project: str, run_id: UUID,
                names: Annotated[list[str] | None, Query(description="e.g. reward/mean (default: all)")] = None,
                after_step: int | None = Query(None, ge=0, le=2**31, description="only points after this step "
                                               "(absent: every point, step 0's included)")):
    """The run's metric series, at most 1,000 points each (consecutive steps averaged beyond that)."""
    run = selectors.run_get(project=caller_project(request, project), run_id=run_id)
    return selectors.metric_history(run=run, after_step=after_step, names=names or None)


@router.get(RUN + "/events", response={200: list[EventOut], **READ_ERRORS})
def run_events(request, project: str, run_id: UUID,
               after: int = Query(0, ge=0, le=2**62, description="only events after this event id")):
    """The run's events, oldest first (at most 500)."""
    run = selectors.run_get(project=caller_project(request, project), run_id=run_id)
    return selectors.event_list(run=run, after_id=after)


# Last: its path would otherwise take /metrics and /events for an action.
@router.post(RUN + "/{action}", response={200: RunOut, **WRITE_ERRORS})
def steer_run(request, project: str, run_id: UUID,
              action: Annotated[Literal["pause", "resume", "cancel", "finish"],
                                Path(description="pause, resume or cancel; finish a run trained elsewhere")]):
    """Pause (the worker checkpoints at the end of its step), resume (queued again) or cancel a run (editors).
    A run trained elsewhere (kind external) is finished or cancelled at once, and its trainer's later episodes are
    refused; it cannot be paused or resumed from here. 409 when the run's state does not allow it (a cancelled run
    cannot be paused)."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    run = selectors.run_get(project=scope, run_id=run_id)
    return run_request(run=run, action=action, actor=request.auth, via="api")  # RunError 409: the run's state

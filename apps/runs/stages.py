"""Stages: a run that starts from another run's checkpoint (`model: checkpoint RUN@STEP`, or `checkpoint ALIAS`), so
"SFT, then GRPO" is two runs with a link between them.

When the run is created, the checkpoint is resolved (apps/runs/checkpoints.py) and the run pins it as
`start_from` {run, run_name, step} — in its config, so the config hash names the weights it starts from — with the
settings that make the model what it was copied from the checkpoint's run (the base model and its pins, the chat
template, the LoRA shape), and the checkpoint is kept out of its run's retention. The attempt loads those weights
before anything trains (`start_weights`); a resumed run's own newest checkpoint is loaded over them by its pipeline.
The checkpoint pages show the chain of runs a checkpoint descends from (`lineage`).
"""

from __future__ import annotations

from apps.accounts.models import Project
from apps.common import wiring
from workers.definitions.specs import FieldError
from workers.rl.config import ConfigError

from .checkpoints import CheckpointNotFound, checkpoint_keep, checkpoint_resolve
from .models import TRAINING_KINDS, Checkpoint, Run

START = "checkpoint "  # model: checkpoint RUN@STEP | checkpoint ALIAS
# What makes the checkpoint's model what it was (the rest of its run's config is how it trained).
MODEL_SETTINGS = ("model", "model_version", "model_sha256", "chat_template", "context_length", "lora_rank",
                  "lora_alpha")
SHAPE = ("lora_rank",)  # a value given for these must be the checkpoint's: its weights have that shape
LINEAGE_DEPTH = 20  # a chain longer than this is cut (each link is a query)


def names_a_checkpoint(model) -> bool:
    return isinstance(model, str) and model.startswith(START)


def start_pinned(settings: dict, *, project: Project) -> dict:
    """Run settings whose `model` names a checkpoint, with the checkpoint pinned as `start_from` and its run's model
    settings in place of the model; other settings unchanged (ConfigError at `model` for a checkpoint that does not
    exist or is not a trained model's; at a shape setting that contradicts the checkpoint)."""
    if not names_a_checkpoint(settings.get("model")):
        return settings
    name = settings["model"].removeprefix(START).strip()
    try:
        checkpoint = checkpoint_resolve(project=project, name=name)
    except CheckpointNotFound as exc:
        raise ConfigError([FieldError("model", f"{exc} (write checkpoint RUN@STEP or checkpoint ALIAS)")]) from None
    source = checkpoint.run
    if source.kind not in TRAINING_KINDS:
        raise ConfigError([FieldError("model", f"{source.name} is a {source.get_kind_display()}, which trains no "
                                               "model to start from")])
    earlier = source.config
    clashes = [FieldError(name, f"{settings[name]!r} differs from {earlier.get(name)!r}, which the weights of "
                                f"{source.name}@{checkpoint.step} were trained with; leave it unset")
               for name in SHAPE if name in settings and settings[name] != earlier.get(name)]
    if clashes:
        raise ConfigError(clashes)
    pinned = {**settings, **{name: earlier[name] for name in MODEL_SETTINGS if name in earlier},
              "start_from": {"run": str(source.pk), "run_name": source.name, "step": checkpoint.step}}
    return pinned


def start_checkpoint(config: dict) -> Checkpoint | None:
    """The checkpoint a run of this (stored) config starts from, or None (a run from its base model)."""
    start = (config or {}).get("start_from") or {}
    if not start:
        return None
    found = Checkpoint.objects.filter(run_id=start["run"], step=start["step"]).select_related("run").first()
    if found is None:
        raise CheckpointNotFound(f"the checkpoint this run starts from, {start['run_name']}@{start['step']}, is "
                                 "gone (its run was deleted)")
    return found


def start_keep(config: dict) -> None:
    """Keep the checkpoint a run of this config starts from out of its own run's retention (called as the run is
    created)."""
    checkpoint = start_checkpoint(config)
    if checkpoint is not None:
        checkpoint_keep(checkpoint)


def start_weights(model, run: Run) -> None:
    """Load the weights of the checkpoint the run starts from into its freshly built model (its policy, and its
    engine, if it samples, as policy version 0: the run's own steps count from there). Nothing for a run from its
    base model."""
    checkpoint = start_checkpoint(run.config)
    if checkpoint is None:
        return
    path = wiring.stored_directory(checkpoint.path)
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{checkpoint.run.name}@{checkpoint.step} ({checkpoint.path}) has no "
                                "model.safetensors: it was removed or never written")
    model.policy.restore(path / "model.safetensors")
    if model.engine is not None:
        model.engine.load_weights(None if model.engine.shares_weights else model.policy.inference_state(), 0)


def lineage(run: Run) -> list[tuple[Run, int]]:
    """(run, step) of each checkpoint the run descends from, nearest first: the SFT run a GRPO run started from,
    the run that one started from, and so on."""
    chain, seen = [], {run.pk}
    start = (run.config or {}).get("start_from") or {}
    while start and len(chain) < LINEAGE_DEPTH:
        parent = Run.objects.filter(pk=start["run"]).first()
        if parent is None or parent.pk in seen:
            break
        chain.append((parent, start["step"]))
        seen.add(parent.pk)
        start = (parent.config or {}).get("start_from") or {}
    return chain

"""Data-parallel GRPO over torch.distributed: one process per device, started by torchrun.

    torchrun --nproc-per-node 2 manage.py train --bundle demo --steps 20 --headless
    torchrun --nproc-per-node 2 -m tests.support.distributed_pipeline --steps 4 --checkpoint-dir /tmp/dp  # no studio

Roles. Rank 0, the leader, runs the pipeline exactly as one process does — rollouts, grading, the tracker (the
database, the archive), checkpoints, logging — with a `LeaderTrainer` as its trainer. Every other rank is a
follower (`follow`): it holds a replica of the policy and computes gradients on its shard of each step's batch,
and — when rank 0's engine is one of the studio's own (torch, transformers) — samples rollouts with an engine
of the same kind over that replica, served over HTTP to rank 0 (engines/ranks.py), which spreads each step's
generation over every rank. It never writes to the database, the archive or the checkpoint directory. Runs that
generate elsewhere (inference servers, an endpoint, vLLM in rank 0's process) keep generation where it is: only
the update is data-parallel.

Protocol. Each collective the leader starts is announced by a message broadcast from rank 0 on a gloo group of
its own (`_send`/`_receive`), which the followers wait on between steps, for as long as rollouts take:
  setup    the policy's architecture, the run's config and length, and what generates: a follower builds its
           replica, then every rank takes rank 0's weights (`broadcast_weights`) and only then builds its
           trainer, so the KL reference, a copy of the initial weights, is the same everywhere; a follower that
           generates then starts its engine and server, and the ranks gather their servers' URLs;
  train    the step's batch, as rows (token ids, loss mask, sampling logprobs, advantage) grouped by task:
           every rank takes its shard (`shard_groups`) and joins the update's all-reduces; a follower that
           generates hands its engine the new weights, and a barrier ends the step on every rank, so that no
           request rank 0 sends after the step meets the old weights;
  restore  the trainer state of the checkpoint rank 0 resumed from (optimizer, schedule, step), then its weights
           (and a barrier, as after a step);
  stop     the run is over (`release`).
A rank that fails exits non-zero, and torchrun stops the others; nothing here tries to recover a rank.

Sharding. Whole GRPO groups per rank, the heaviest group (in tokens) first to the least loaded rank, ties to the
lower index: deterministic from the batch alone, so every rank computes the same partition without talking.
Advantages are assigned before the batch is sharded (the pipeline's _select, over each whole group), so they do
not depend on the partition at all; groups are kept whole so that a group's shared prompt is computed once in
one micro-batch (HFPolicy). With fewer groups than ranks, some ranks have nothing to do that step (they still
join the all-reduces, with zero gradients).

Normalisation. The loss is the token-level mean over the whole batch: its per-token terms summed, divided by the
batch's trained-token count. Every rank divides its own shard's sum by the whole batch's count (all-reduced
before the first micro-batch: GRPOTrainer._sum_over_ranks), so the SUM of the ranks' gradients — one all-reduce
per step, not DDP's average — is exactly the full batch's gradient. Clipping, AdamW and the learning-rate
schedule then run on identical gradients in every rank, so the replicas stay identical without broadcasting
weights after a step, and an update equals the single-process update on the same batch up to the order of
floating-point sums.

Why not DistributedDataParallel: DDP all-reduces inside every backward it does not skip (no_sync), and ranks
run different numbers of micro-batches (their shards differ in rows and lengths) — unequal backward counts would
leave one rank waiting on a collective the other never starts; HFPolicy's prompt sharing also runs the module
twice per backward. Accumulating locally and all-reducing once per step sends the same bytes DDP would, without
overlapping them with the backward, which does not matter for models that fit one device. Models that do not:
docs/FSDP.md.

Backends: gloo on the CPU; with CUDA, one default group "cpu:gloo,cuda:nccl" (each collective goes to the backend
of its tensors' device: gradients of a CUDA policy over NCCL, the CPU-side counts over gloo), and each rank's
"cuda" is its own device (LOCAL_RANK).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..config import GRPOConfig
from ..engines.ranks import RanksEngine
from ..models.policies import HFPolicy, TinyLMPolicy
from .trainer import GRPOTrainer, training_rows

# The followers wait on the control group while rank 0 rolls out, grades and evaluates: hours, on a CPU.
CONTROL_TIMEOUT = timedelta(seconds=float(os.environ.get("STUDIO_DISTRIBUTED_WAIT_SECONDS", 6 * 3600)))
# The update's own collectives: every rank is inside the same step when they run.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
BUCKET_BYTES = 64 << 20  # gradients all-reduced per flat buffer of at most this much (and at least one tensor)


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    local_rank: int
    backend: str

    @property
    def leader(self) -> bool:
        return self.rank == 0


def topology_from_env(env=None) -> Topology | None:
    """The process's place from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK; MASTER_ADDR and MASTER_PORT
    are read by init_process_group); None for a single process."""
    env = os.environ if env is None else env
    world_size = int(env.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return None
    rank = int(env["RANK"])
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    return Topology(rank=rank, world_size=world_size, local_rank=int(env.get("LOCAL_RANK", rank)), backend=backend)


_topology: Topology | None = None
_control = None  # the gloo group the leader's messages travel on


def setup() -> Topology | None:
    """Joins the process group torchrun's environment describes (once); None when there is none to join."""
    global _topology, _control
    if _topology is not None:
        return _topology
    topology = topology_from_env()
    if topology is None:
        return None
    if torch.cuda.is_available() and topology.local_rank < torch.cuda.device_count():
        torch.cuda.set_device(topology.local_rank)  # "cuda" is this rank's own device from here on
    dist.init_process_group(backend=topology.backend, init_method="env://", rank=topology.rank,
                            world_size=topology.world_size, timeout=COLLECTIVE_TIMEOUT)
    _control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    _topology = topology
    return topology


def current() -> Topology | None:
    return _topology


def teardown() -> None:
    global _topology, _control
    _close_generation()
    if _topology is not None:
        dist.destroy_process_group()
    _topology = _control = None


# --- the leader's messages ------------------------------------------------------------------------------------


def _send(message: dict) -> None:
    dist.broadcast_object_list([message], src=0, group=_control)


def _receive() -> dict:
    box = [None]
    dist.broadcast_object_list(box, src=0, group=_control)
    return box[0]


def release() -> None:
    """Rank 0: the run is over, the followers may exit."""
    if _topology is not None and _topology.leader:
        _close_generation()
        _send({"kind": "stop"})


@contextmanager
def leading() -> Iterator[None]:
    """Rank 0's part of a run: the followers are released when it ends normally. After an error they are not
    told (one may be inside a collective the leader left); the leader exits non-zero and torchrun stops them."""
    yield
    release()


# --- sharding and synchronisation ---------------------------------------------------------------------------


def shard_groups(grouped: list[list[tuple]], *, rank: int, world_size: int) -> list[list[tuple]]:
    """This rank's whole groups of the step's batch, in their order in the batch: the heaviest group (tokens of
    its sequences) first to the least loaded rank, ties to the lower group index and the lower rank."""
    costs = [sum(len(ids) for (ids, _, _), _ in group) for group in grouped]
    loads, mine = [0] * world_size, []
    for index in sorted(range(len(grouped)), key=lambda i: (-costs[i], i)):
        target = min(range(world_size), key=lambda r: (loads[r], r))
        loads[target] += costs[index]
        if target == rank:
            mine.append(index)
    return [grouped[index] for index in sorted(mine)]


@torch.no_grad()
def broadcast_weights(module: torch.nn.Module, *, src: int = 0) -> None:
    """Every tensor of the module's state (parameters and buffers) takes rank `src`'s values, in place."""
    seen = set()
    for tensor in module.state_dict().values():
        key = (tensor.device, tensor.data_ptr())
        if key in seen:  # tied weights: one storage, sent once
            continue
        seen.add(key)
        if tensor.is_contiguous():
            dist.broadcast(tensor, src=src)
        else:
            buffer = tensor.contiguous()
            dist.broadcast(buffer, src=src)
            tensor.copy_(buffer)


def _buckets(tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    bucket, size = [], 0
    for tensor in tensors:
        if bucket and (tensor.dtype != bucket[0].dtype or tensor.device != bucket[0].device
                       or size + tensor.numel() * tensor.element_size() > BUCKET_BYTES):
            yield bucket
            bucket, size = [], 0
        bucket.append(tensor)
        size += tensor.numel() * tensor.element_size()
    if bucket:
        yield bucket


class DataParallelTrainer(GRPOTrainer):
    """A GRPOTrainer whose update is one of `world_size` ranks' share of the step: `train`/`train_rows` take the
    WHOLE batch (the same on every rank) and train on this rank's shard; counts and gradients are summed over
    the ranks. Every rank builds one over the same architecture; rank 0's initial weights win."""

    def __init__(self, policy, *, config: GRPOConfig, total_steps: int):
        self.topology = _topology
        if self.topology is None:
            raise RuntimeError("no process group: call distributed.setup() under torchrun first")
        broadcast_weights(policy.model)  # before the trainer copies them (the KL reference)
        super().__init__(policy, config=config, total_steps=total_steps)

    def train_rows(self, grouped: list[list[tuple]]):
        return super().train_rows(shard_groups(grouped, rank=self.topology.rank,
                                               world_size=self.topology.world_size))

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        summed = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(summed)
        return summed.tolist()

    @torch.no_grad()
    def _sync_gradients(self) -> None:
        parameters = self.policy.trainable_parameters()
        # A parameter no rank's shard reached keeps no gradient (AdamW skips it, as in one process); one that
        # some rank's did gets zeros where it did not.
        present = torch.tensor([float(p.grad is not None) for p in parameters])
        dist.all_reduce(present)
        gradients = []
        for parameter, count in zip(parameters, present.tolist(), strict=True):
            if count and parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            if count:
                gradients.append(parameter.grad)
        for bucket in _buckets(gradients):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)  # SUM: each rank's loss is already divided by the whole batch's tokens
            offset = 0
            for gradient in bucket:
                gradient.copy_(flat[offset:offset + gradient.numel()].view_as(gradient))
                offset += gradient.numel()


class LeaderTrainer(DataParallelTrainer):
    """Rank 0's trainer inside the pipeline: announces each update (and each restore) to the followers, then
    takes its own part in it. With `engine` one of the studio's own, the followers generate too: `engine` then
    wraps rank 0's engine into one that spreads the rollouts over every rank (engines/ranks.py)."""

    def __init__(self, policy, *, config: GRPOConfig, total_steps: int, engine=None):
        generation = generation_spec(engine, config)
        _send({"kind": "setup", "policy": policy_spec(policy, config), "config": dataclasses.asdict(config),
               "total_steps": total_steps, "device_type": torch.device(policy.device).type,
               "generation": generation})
        super().__init__(policy, config=config, total_steps=total_steps)
        self.engine = engine
        if generation is not None:
            urls = _gather_urls("")
            _open_generation(RanksEngine(engine, urls[1:], token=generation["token"],
                                         max_staleness=config.max_staleness,
                                         max_concurrency=max(8, config.rollout_concurrency * 4)))
            self.engine = _generation

    @property
    def generates_on_every_rank(self) -> bool:
        return isinstance(self.engine, RanksEngine)

    def train(self, groups):
        grouped = training_rows(groups, oldest_version=self.oldest_trained_version())
        _send({"kind": "train", "rows": grouped})
        stats = self.train_rows(grouped)
        if self.generates_on_every_rank:
            dist.barrier(group=_control)  # every follower's engine has this step's weights
        return stats

    def restore(self, state: dict) -> None:
        """After load_checkpoint restored rank 0's weights: the trainer state here and in every follower, then
        the weights."""
        super().restore(state)
        _send({"kind": "restore", "state": _to_cpu(state)})
        broadcast_weights(self.policy.model)
        if self.generates_on_every_rank:
            dist.barrier(group=_control)


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(item) for item in value)
    return value


def trainer_for(policy, *, config: GRPOConfig, total_steps: int, engine=None) -> GRPOTrainer:
    """The pipeline's trainer: a LeaderTrainer under torchrun (on rank 0, the only one that builds a pipeline),
    a plain GRPOTrainer otherwise. `engine`: rank 0's engine (the followers build one like it if they can)."""
    if _topology is None:
        return GRPOTrainer(policy, config=config, total_steps=total_steps)
    if not _topology.leader:
        raise RuntimeError(f"rank {_topology.rank} builds no pipeline: the ranks after 0 follow() rank 0")
    return LeaderTrainer(policy, config=config, total_steps=total_steps, engine=engine)


def rollout_engine(trainer: GRPOTrainer, engine):
    """The engine the pipeline rolls out with: under torchrun, the one that spreads generation over every rank
    if rank 0's trainer made one; `engine` otherwise."""
    return trainer.engine if isinstance(trainer, LeaderTrainer) else engine


# --- generation on every rank ---------------------------------------------------------------------------------

_generation = None  # this process's part in it: rank 0's RanksEngine, or a follower's _RankServer

# The engines a follower can build over its replica: the studio's own. vLLM in rank 0's process would need one
# vLLM per rank (and its memory) and is left to rank 0; inference servers and endpoints generate elsewhere.
REPLICABLE_ENGINES = ("torch", "transformers")


def generation_spec(engine, config: GRPOConfig) -> dict | None:
    """What a follower needs to generate like rank 0's `engine` (None: rank 0 generates alone)."""
    if engine is None or engine.name not in REPLICABLE_ENGINES:
        return None
    # The followers' servers answer only with this run's token (made here, sent over the process group).
    return {"engine": engine.name, "share": bool(engine.shares_weights), "token": secrets.token_urlsafe(24),
            "max_context": engine.max_context, "chat_template": config.chat_template}


def _gather_urls(mine: str) -> list[str]:
    urls = [None] * _topology.world_size
    dist.all_gather_object(urls, mine, group=_control)
    return urls


def _open_generation(part) -> None:
    global _generation
    _close_generation()
    _generation = part


def _close_generation() -> None:
    global _generation
    if _generation is not None:
        _generation.close()
    _generation = None


def serving_address(topology: Topology, env=None) -> tuple[str, str]:
    """(the interface a follower's server listens on, the host rank 0 reaches it at): the loopback when every
    rank is on this host (torchrun's LOCAL_WORLD_SIZE), else STUDIO_RANK_ADDRESS or this host's name."""
    env = os.environ if env is None else env
    if env.get("STUDIO_RANK_ADDRESS"):
        return "0.0.0.0", env["STUDIO_RANK_ADDRESS"]
    if int(env.get("LOCAL_WORLD_SIZE", topology.world_size)) == topology.world_size:
        return "127.0.0.1", "127.0.0.1"
    return "0.0.0.0", socket.getfqdn()


class _RankServer:
    """A follower's engine over its replica, served by the studio's OpenAI-compatible app (serving/) under
    uvicorn on a thread, on a free port."""

    def __init__(self, spec: dict, policy, config: GRPOConfig, *, topology: Topology):
        import uvicorn

        from ..serving.app import build_app

        self.policy, self.spec = policy, spec
        self.engine, chat = _replica_engine(spec, policy, config)
        self.hand_weights(0)
        bind, host = serving_address(topology)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, 0))
        self.url = f"http://{host}:{listener.getsockname()[1]}/v1"
        app = build_app(engine=self.engine, chat=chat, model_name=f"rank-{topology.rank}",
                        weights_token=spec["token"], api_token=spec["token"])
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=60))
        threading.Thread(target=self.server.run, kwargs={"sockets": [listener]}, name="rank-server",
                         daemon=True).start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or self.server.should_exit:
                raise RuntimeError(f"rank {topology.rank}: its generation server did not start")
            time.sleep(0.02)

    def hand_weights(self, version: int) -> None:
        """The engine samples with the replica's weights (as updated by the trainer) from its next batch on."""
        self.engine.load_weights(None if self.engine.shares_weights else self.policy.inference_state(), version)

    def close(self) -> None:
        self.server.should_exit = True
        self.engine.close()


def _replica_engine(spec: dict, policy, config: GRPOConfig):
    """(engine, chat format) of the kind rank 0 generates with, over this rank's replica."""
    if spec["engine"] == "torch":
        from ..engines.torch_engine import TorchEngine
        from ..models.chat_formats import CharChat

        return TorchEngine(policy.model, device=policy.device, share=spec["share"]), CharChat()
    from ..engines.hf import TransformersEngine
    from ..models.chat_formats import HFChat

    if spec["chat_template"]:
        policy.tokenizer.chat_template = spec["chat_template"]
    engine = TransformersEngine(policy.path, device=policy.device,
                                shared_model=policy.model if spec["share"] else None)
    engine.max_context = spec["max_context"]
    return engine, HFChat(policy.tokenizer)


# --- the followers ----------------------------------------------------------------------------------------------


def policy_spec(policy, config: GRPOConfig) -> dict:
    """What a follower needs to build a replica of the policy's architecture (the weights come from rank 0)."""
    if isinstance(policy, TinyLMPolicy):
        return {"kind": "tinylm", "model": dataclasses.asdict(policy.model.config)}
    if isinstance(policy, HFPolicy):  # the same local path on every node
        return {"kind": "hf", "path": policy.path, "lora_rank": config.lora_rank, "lora_alpha": config.lora_alpha}
    raise TypeError(f"no data-parallel replica for a {type(policy).__name__}")


def policy_from_spec(spec: dict, *, device: str):
    if spec["kind"] == "tinylm":
        from ..models.tiny_lm import ModelConfig, TinyLM

        return TinyLMPolicy(TinyLM(ModelConfig(**spec["model"])), device=device)
    if spec["kind"] == "hf":
        return HFPolicy(spec["path"], device=device, lora_rank=spec["lora_rank"], lora_alpha=spec["lora_alpha"])
    raise ValueError(f"unknown policy kind {spec['kind']!r}")


def follow() -> int:
    """A follower rank's whole part in a run: serve rank 0's messages until it says stop. Returns the updates
    this rank took part in."""
    topology = _topology
    if topology is None or topology.leader:
        raise RuntimeError("follow() is for the ranks after 0 of a process group (distributed.setup())")
    trainer, updates = None, 0

    def step_done() -> None:
        if isinstance(_generation, _RankServer):
            _generation.hand_weights(trainer.step)
            dist.barrier(group=_control)  # rank 0 sends nothing more before every engine has these weights

    try:
        while True:
            message = _receive()
            kind = message["kind"]
            if kind == "stop":
                return updates
            if kind == "setup":
                _close_generation()  # an earlier attempt's, in the same processes
                device = f"cuda:{topology.local_rank}" if message["device_type"] == "cuda" \
                    else message["device_type"]
                policy = policy_from_spec(message["policy"], device=device)
                config = GRPOConfig.from_dict(message["config"])
                trainer = DataParallelTrainer(policy, config=config, total_steps=message["total_steps"])
                if message["generation"] is not None:
                    _open_generation(_RankServer(message["generation"], policy, config, topology=topology))
                    _gather_urls(_generation.url)
            elif kind == "train":
                trainer.train_rows(message["rows"])
                updates += 1
                step_done()
            elif kind == "restore":
                trainer.restore(message["state"])
                broadcast_weights(trainer.policy.model)
                step_done()
            else:
                raise RuntimeError(f"rank {topology.rank}: unknown message {kind!r} from rank 0")
    finally:
        _close_generation()

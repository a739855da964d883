"""What an environment server serves: one bundle version of one project, its tasks, and the sandbox pool and
verifier its episodes run on.

A reset chooses the task the way a run draws one (the bundle's domain mix through the engine's scheduler,
workers/rl/tasks/scheduler.py; a seed makes the draw reproducible), or takes the one it names: a domain, a template
of the bundle (`add-two`, `add-two@1` or `task_template/add-two@1`), a task key. Only the bundle's own templates and
tasks are served: anything else, another project's included, is refused by name with what is served instead.

The episodes' tool calls and verifications run in this process, on a pool made by the composition root
(apps/common/wiring) under the same settings, sandbox limits and egress policy as the studio's own workers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from apps.accounts.models import Project
from apps.common import wiring
from apps.common.errors import StudioError
from apps.registry.models import Version
from apps.registry.pins import bundle_tasks
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve
from workers.rl.config import SandboxConfig
from workers.rl.rollout.metrics import Prices
from workers.rl.tasks.scheduler import Scheduler
from workers.rl.tasks.taskset import TaskSet
from workers.rl.types import Task


class TaskRefused(StudioError):
    """A reset named a domain, template or task this server does not serve."""

    status = 404


@dataclass
class ServedBundle:
    project: Project
    bundle: Version
    tasks: TaskSet
    tool_runner: object  # protocols.ToolRunner
    verifier: object  # protocols.Verifier
    prices: Prices
    pool: object  # the SandboxPool the runners use; closed with the server

    @classmethod
    def open(cls, *, project: Project, bundle: str, sessions: int) -> ServedBundle:
        """`bundle`: SLUG, SLUG@N or SLUG@alias of `project`. `sessions`: the sessions the server may hold at once,
        which a pool lets hold sandboxes of one prepared workspace at once (64 trainers' rollouts of one
        repository task share it)."""
        version = version_resolve(project=project, ref=Ref("bundle", *split_slug_ref(bundle)))
        tasks = bundle_tasks(bundle=version)
        pool = wiring.sandbox_pool(session_ceiling=sessions)
        for template in tasks.templates.values():  # warming in the background: the first episodes start warm
            if template.session is None:
                pool.warm(template.image)
        tool_runner, verifier = wiring.local_runners(pool, SandboxConfig())
        return cls(project=project, bundle=version, tasks=tasks, tool_runner=tool_runner, verifier=verifier,
                   prices=wiring.prices(), pool=pool)

    def close(self) -> None:
        self.pool.close()

    def task(self, *, seed: int | None = None, domain: str | None = None, template: str | None = None,
             task: str | None = None) -> Task:
        """The task a reset asks for; TaskRefused names the field that asked for one not served."""
        domains = self.tasks.domains
        if domain is not None:
            domains = [mix for mix in domains if mix.name == domain]
            if not domains:
                raise TaskRefused(f"{self.bundle.ref} has no domain {domain!r}; it serves "
                                  f"{', '.join(mix.name for mix in self.tasks.domains)}", field="domain")
        served = [t.key for mix in domains for t in mix.templates]
        if template is not None:
            key = self._template(template, served)
            keys = [task] if task is not None else list(self.tasks.items[key])
            if task is not None and task not in self.tasks.items[key]:
                raise TaskRefused(f"{key} has no task {task!r} in {self.bundle.ref}", field="task")
            return self.tasks.task(0, key, random.Random(seed).choice(keys))
        if task is not None:
            holders = [key for key in served if task in self.tasks.items[key]]
            if len(holders) != 1:
                raise TaskRefused(f"no template of {self.bundle.ref} has a task {task!r}" if not holders else
                                  f"{len(holders)} templates have a task {task!r} ({', '.join(holders)}): name the "
                                  "template too", field="task")
            return self.tasks.task(0, holders[0], task)
        drawn = Scheduler(domains, seed=seed if seed is not None else random.randrange(2**63)).sample(1)[0]
        return self.tasks.task(0, drawn.template, drawn.task_key)

    def _template(self, text: str, served: list[str]) -> str:
        """The served template key `text` names: `slug`, `slug@N` or `task_template/slug@N`."""
        slug, number = split_slug_ref(text.removeprefix("task_template/"))
        matches = [key for key in served if split_slug_ref(key.removeprefix("task_template/"))[0] == slug
                   and (number is None or key.endswith(f"@{number}"))]
        if not matches:
            raise TaskRefused(f"{self.bundle.ref} serves no template {text!r}; it serves {', '.join(served)}",
                              field="template")
        return matches[0]

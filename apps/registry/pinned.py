"""From registry versions to the engine's plain dataclasses: what a worker needs to run one task template.

The engine (workers/) never reads the database; this module resolves a template version's references to
exact versions and hands over a SandboxImage, the verifier spec and task instances as Items.
"""

from dataclasses import dataclass

from django.conf import settings

from apps.accounts.models import Project
from workers.sandbox import SandboxImage
from workers.verifiers import Context, Item

from .errors import VersionNotFound
from .models import InstanceSetMember, Version
from .refs import Ref, split_slug_ref
from .selectors import version_resolve


@dataclass(frozen=True)
class PinnedTemplate:
    template: Version
    image_version: Version
    verifier_version: Version

    @property
    def image(self) -> SandboxImage:
        return SandboxImage.from_spec(self.image_version.ref, self.image_version.spec)

    @property
    def verifier_spec(self) -> dict:
        return self.verifier_version.spec


def pinned_template(*, project: Project, text: str) -> PinnedTemplate:
    """`slug`, `slug@N` or `slug@alias` of a task template, with its image and verifier resolved."""
    template = version_resolve(project=project, ref=Ref("task_template", *split_slug_ref(text)))
    image = version_resolve(project=project, ref=Ref("sandbox_image", *split_slug_ref(template.spec["sandbox_image"])))
    verifier = version_resolve(project=project, ref=Ref("verifier", *split_slug_ref(template.spec["verifier"])))
    return PinnedTemplate(template=template, image_version=image, verifier_version=verifier)


def task_item(*, template: Version, key: str) -> Item:
    member = (InstanceSetMember.objects.filter(instance_set_id=template.instance_set_id, key=key)
              .select_related("instance").first())
    if member is None:
        raise VersionNotFound(f"{template.ref} has no task instance {key!r}")
    return Item(key=key, inputs=member.instance.inputs, hidden=member.instance.hidden)


def verification_context(*, pool, image: SandboxImage) -> Context:
    """The machinery verification shares, configured from the settings (the judge, its cache and prices)."""
    judge = None
    if settings.JUDGE_BASE_URL:
        from workers.verifiers.judge import InMemoryJudgeCache, JudgeClient, RedisJudgeCache

        judge = JudgeClient(settings.JUDGE_BASE_URL, settings.JUDGE_API_KEY or "none",
                            timeout_seconds=settings.JUDGE_TIMEOUT_SECONDS,
                            max_concurrency=settings.JUDGE_MAX_CONCURRENCY,
                            cache=RedisJudgeCache(settings.REDIS_URL) if settings.REDIS_URL else InMemoryJudgeCache(),
                            price_per_1k_input_tokens=settings.JUDGE_PRICE_PER_1K_INPUT_TOKENS,
                            price_per_1k_output_tokens=settings.JUDGE_PRICE_PER_1K_OUTPUT_TOKENS)
    return Context(pool=pool, image=image, judge=judge)

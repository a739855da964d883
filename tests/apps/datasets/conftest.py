"""A labelled review queue over two GRPO groups (tests/support/review.py), what datasets are built from."""

import pytest

from apps.registry.services import version_publish
from tests.support.review import labelled_queue
from tests.support.specimens import RUBRIC


@pytest.fixture
def labelled(project, registry, owner, member):
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    return labelled_queue(project=project, bundle=registry["bundle"], rubric=rubric, owner=owner,
                          reviewers=(member("reviewer"), member("editor")))

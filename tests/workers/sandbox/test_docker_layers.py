"""The docker backend builds images layer by layer, with the layer's chain hash as the build cache."""

import uuid

import pytest

from tests.support.sandbox import TIGHT
from workers.sandbox import Execution, SandboxImage, Status

pytestmark = pytest.mark.docker


@pytest.fixture
def backend():
    from workers.sandbox.docker import DockerBackend

    return DockerBackend()


def image(*layers):
    return SandboxImage(key="test/docker-layers@1", layers=({"type": "base", "image": "python-3.11"}, *layers),
                        limits=TIGHT, warm_pool_size=0)


def test_layers_are_built_once_and_a_change_rebuilds_only_what_follows(backend):
    nonce = uuid.uuid4().hex  # this run's own layers, whatever earlier runs left in the engine's cache
    packages = {"type": "python_packages", "packages": ["six==1.16.0"]}
    files = {"type": "files", "files": {"data/run.txt": nonce}}
    setup = {"type": "setup_script", "script": f"echo {nonce} | tr a-f A-F > shouted.txt"}
    first = image(packages, files, setup)
    tags = [backend.image_tag(first)]
    built = backend.builds
    assert built >= 2  # files and setup are new to the engine; base and packages may be cached from before
    assert backend.image_tag(first) == tags[0] and backend.builds == built
    changed = image(packages, files, {"type": "setup_script", "script": "echo changed > shouted.txt"})
    tags.append(backend.image_tag(changed))
    assert backend.builds == built + 1  # only the last layer

    sandbox = backend.start(first)
    try:
        result = sandbox.run(Execution(program="import six\nprint(six.__version__, open('data/run.txt').read(),"
                                               " open('shouted.txt').read().strip())"))
    finally:
        sandbox.destroy()
    assert result.status == Status.OK, result.stderr
    assert result.stdout.decode().split() == ["1.16.0", nonce, nonce.upper()]
    for tag in tags:
        backend.client.images.remove(tag)


def test_system_packages_are_refused_with_the_reason(backend):
    from workers.sandbox.layers import LayerBuildError

    with pytest.raises(LayerBuildError, match="no package manager"):
        backend.image_tag(image({"type": "system_packages", "packages": [f"x{uuid.uuid4().hex[:8]}"]}))

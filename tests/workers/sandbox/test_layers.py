"""The process backend's layer cache: built once per layer chain, invalidated from the changed layer on."""

import pytest

from tests.support.sandbox import TIGHT
from workers.sandbox import Execution, SandboxImage, Status
from workers.sandbox.layers import LayerBuildError, LayerCache
from workers.sandbox.process import ProcessBackend

BASE = {"type": "base", "image": "python-3.11-slim"}
PACKAGES = {"type": "python_packages", "packages": ["six==1.16.0"]}
FILES = {"type": "files", "files": {"docs/readme.txt": "hello from the image"}}


def image(*layers, key="test/layered@1"):
    return SandboxImage(key=key, layers=tuple(layers), limits=TIGHT, warm_pool_size=0)


@pytest.mark.sandbox
def test_packages_and_files_are_in_every_sandbox_and_built_once(cache_root):
    cache = LayerCache(cache_root)
    backend = ProcessBackend(layers=cache)
    layered = image(BASE, PACKAGES, FILES)
    for _ in range(2):
        sandbox = backend.start(layered)
        result = sandbox.run(Execution(program="import six; print(six.__version__, open('docs/readme.txt').read())"))
        sandbox.destroy()
        assert result.status == Status.OK, result.stderr
        assert result.stdout == b"1.16.0 hello from the image\n"
    assert cache.builds == 3  # base, packages, files: once each for two sandboxes


@pytest.mark.sandbox
def test_changing_a_layer_rebuilds_it_and_the_layers_after_it_only(cache_root):
    cache = LayerCache(cache_root)
    cache.materialize(image(BASE, PACKAGES, FILES))
    assert cache.builds == 3
    cache.materialize(image(BASE, PACKAGES, {"type": "files", "files": {"docs/readme.txt": "changed"}}))
    assert cache.builds == 4  # only the files layer; six was not installed again
    cache.materialize(image(BASE, {"type": "setup_script", "script": "echo built > built.txt"}, FILES))
    assert cache.builds == 6


@pytest.mark.sandbox
def test_setup_scripts_run_once_and_their_output_ships_with_the_image(cache_root):
    backend = ProcessBackend(layers=LayerCache(cache_root))
    sandbox = backend.start(image(BASE, {"type": "setup_script", "script": "seq 3 > numbers.txt"}))
    result = sandbox.run(Execution(program="print(open('numbers.txt').read().split())"))
    sandbox.destroy()
    assert result.stdout == b"['1', '2', '3']\n"


@pytest.mark.parametrize("layer, message", [
    ({"type": "base", "image": "node-20"}, "runs this machine's Python 3.11"),
    ({"type": "system_packages", "packages": ["definitely-not-a-package"]},
     "definitely-not-a-package are not installed"),
])
def test_what_the_process_backend_cannot_build_is_named(cache_root, layer, message):
    layers = (layer,) if layer["type"] == "base" else (BASE, layer)
    with pytest.raises(LayerBuildError, match=message):
        LayerCache(cache_root).materialize(image(*layers))


def test_a_cache_out_of_the_sandboxes_reach_is_named(tmp_path):
    private = tmp_path / "cache"  # under pytest's root-only directory
    with pytest.raises(LayerBuildError, match="out of the sandboxes' reach"):
        LayerCache(private).materialize(image(BASE))

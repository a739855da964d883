"""The mesh_geometry check: right and subtly wrong solids, hostile STL bytes, the renders, and candidate and
reference scripts run in a real bubblewrap sandbox with trimesh installed in a layer."""

import io
import uuid

import numpy as np
import pytest
import trimesh
from PIL import Image

from apps.demo import modelling3d
from tests.support.sandbox import process_pool
from workers.definitions.specs import MeshGeometry
from workers.sandbox import ExecutionResult, Limits, SandboxImage, Status
from workers.verifiers.mesh import MAX_FACES, MAX_STL_BYTES, mesh_geometry_check, render
from workers.verifiers.types import INFRA_ERROR, Context, Item, Sample

check = mesh_geometry_check
SPEC = MeshGeometry(type="mesh_geometry", require_watertight=True, volume_rel_tolerance=0.02, bbox_abs_tolerance=0.05,
                    iou_threshold=0.9, render_views=["iso", "front"])
STUB_IMAGE = SandboxImage(key="test/stub@1", layers=())


class ReferencePool:
    """Stands in for the sandbox where a test needs only the reference solid: every program 'writes' the STL
    built here, and nothing runs."""

    def __init__(self, mesh=None, status=Status.OK):
        self.stl = mesh.export(file_type="stl") if mesh is not None else None
        self.status = status
        self.programs = []

    def execute(self, image, execution, **_):
        self.programs.append(execution.program)
        files = {"out.stl": self.stl} if self.stl is not None and self.status == Status.OK else {}
        return ExecutionResult(status=self.status, exit_code=0 if self.status == Status.OK else 1, files=files,
                               stderr=b"Traceback ...\nNameError: name 'trimesh' is not defined\n",
                               reason="" if self.status == Status.OK else "exited with status 1")


def box(extents=(40, 20, 10), shift=(0, 0, 0)):
    mesh = trimesh.creation.box(extents=extents)
    mesh.apply_translation(shift)
    return mesh


def cylinder(sections=128, radius=10, height=30):
    mesh = trimesh.creation.cylinder(radius=radius, height=height, sections=sections)
    mesh.apply_translation([0, 0, height / 2])  # resting on the XY plane, as the demo asks
    return mesh


def task(reference, volume):
    """An item with the demo's hidden fields: closed-form volume and bounds, and a reference script (a unique
    text per call, so the module's reference cache never hands one test another test's solid)."""
    lower, upper = reference.bounds.tolist()
    hidden = {"volume": volume, "bounds": [lower, upper], "extents": reference.extents.tolist(),
              "watertight": True, "reference_script": f"# reference {uuid.uuid4()}\n"}
    return Item(key="t", inputs={}, hidden=hidden), Context(pool=ReferencePool(reference), image=STUB_IMAGE)


BOX_TASK = (box(), 40 * 20 * 10)
CYLINDER_TASK = (cylinder(), np.pi * 10 ** 2 * 30)


def grade(candidate_stl: bytes, reference_and_volume=BOX_TASK, spec=SPEC):
    item, context = task(*reference_and_volume)
    return check(spec, Sample(response="", files={"out.stl": candidate_stl}), item, context)


def stl(mesh) -> bytes:
    return mesh.export(file_type="stl")


@pytest.mark.parametrize("candidate, reference", [
    (box(), BOX_TASK),
    (trimesh.creation.box(bounds=[[-20, -10, -5], [20, 10, 5]]), BOX_TASK),  # built another way
    (cylinder(), CYLINDER_TASK),
    (cylinder(sections=64), CYLINDER_TASK),  # a coarser tessellation within the tolerances
])
def test_the_right_solid_scores_one(candidate, reference):
    outcome = grade(stl(candidate), reference)
    assert outcome.value == 1.0 and outcome.status == "pass", outcome.evidence
    assert outcome.evidence.startswith("5/5 sub-checks passed")


def test_a_box_two_percent_too_long_fails_its_extents():
    outcome = grade(stl(box(extents=(40.8, 20, 10))))
    assert outcome.value < 1
    assert "extents: 40.8 × 20 × 10, expected 40 × 20 × 10 ± 0.05 (X off by 0.8)" in outcome.evidence
    assert "position" not in outcome.evidence.split("; passed:")[0]  # still centred


def test_a_cylinder_with_too_few_segments_fails_its_volume_only():
    outcome = grade(stl(cylinder(sections=12)), CYLINDER_TASK)  # 12 sides: 4.5% short of the round volume
    assert outcome.value == pytest.approx(0.8)
    failed = outcome.evidence.split("; passed:")[0]
    assert "volume: " in failed and "-4.5" in failed
    assert "extents" not in failed and "iou" not in failed


def test_a_mesh_with_one_face_removed_is_not_a_solid():
    holed = box()
    holed.update_faces(np.arange(1, len(holed.faces)))
    outcome = grade(stl(holed))
    assert outcome.value == pytest.approx(2 / 5)  # extents and position still hold
    assert "watertight: not closed: 3 open edges" in outcome.evidence
    assert "volume: needs a closed solid" in outcome.evidence and "iou: needs a closed solid" in outcome.evidence


def test_an_inside_out_mesh_is_not_a_solid():
    inverted = box()
    inverted.invert()
    outcome = grade(stl(inverted))
    assert outcome.value < 1 and "inside out" in outcome.evidence


def test_placement_counts_a_shifted_box_fails_its_position():
    outcome = grade(stl(box(shift=(1.0, 0, 0))))
    failed = outcome.evidence.split("; passed:")[0]
    assert "position: centre (1, 0, 0), expected centre (0, 0, 0) ± 0.05 (X off by 1)" in failed
    assert "extents" not in failed
    assert "iou" not in failed  # 39/41 of the box still overlaps: IoU 0.95
    assert outcome.value == pytest.approx(0.8)


def test_a_far_away_box_fails_position_and_iou():
    outcome = grade(stl(box(shift=(0, 0, 100))))
    assert outcome.value == pytest.approx(0.6)
    assert "iou: 0.0000 < 0.9" in outcome.evidence


@pytest.mark.parametrize("data, says", [
    (b"garbage " * 100, "not an STL mesh with at least one triangle"),
    (b"solid x\nfacet normal 0 0 1\nouter loop\nvertex 0 0 nope\n", "out.stl: "),
    (bytes(np.random.default_rng(7).integers(0, 256, 84 + 50 * 20, dtype=np.uint8)), "out.stl: "),
    (b"", "not an STL mesh"),
])
def test_garbage_bytes_score_zero_with_the_reason(data, says):
    outcome = grade(data)
    assert outcome.value == 0 and outcome.status == "fail"
    assert says in outcome.evidence


def test_a_non_finite_coordinate_drops_its_face_and_so_the_solid():
    data = bytearray(stl(box()))
    data[84 + 12:84 + 16] = np.float32(np.nan).tobytes()  # the first face's first x
    outcome = grade(bytes(data))
    assert outcome.value < 1 and "watertight: not closed" in outcome.evidence


def test_an_oversized_file_scores_zero_before_it_is_parsed():
    outcome = grade(b"\0" * (MAX_STL_BYTES + 1))
    assert outcome.value == 0 and "over the 50 MB limit" in outcome.evidence
    faces = MAX_FACES + 1  # within the byte limit, but declaring too many faces
    header = b"\0" * 80 + faces.to_bytes(4, "little")
    outcome = grade(header + b"\0" * (50 * faces))
    assert outcome.value == 0 and f"{faces} faces is over the {MAX_FACES} limit" in outcome.evidence


def test_no_mesh_and_no_script_scores_zero():
    item, context = task(*BOX_TASK)
    outcome = check(SPEC, Sample(response="Here is a box."), item, context)
    assert outcome.value == 0 and "no out.stl" in outcome.evidence


def test_a_reference_script_that_fails_is_the_tasks_fault_not_a_score():
    item, _ = task(*BOX_TASK)
    context = Context(pool=ReferencePool(status=Status.ERROR), image=STUB_IMAGE)
    outcome = check(SPEC, Sample(response="", files={"out.stl": stl(box())}), item, context)
    assert outcome.status == INFRA_ERROR and outcome.value is None
    assert "the task's reference script" in outcome.evidence and "NameError" in outcome.evidence


def test_a_reference_that_is_no_solid_is_the_tasks_fault_too():
    holed = box()
    holed.update_faces(np.arange(1, len(holed.faces)))
    item, _ = task(*BOX_TASK)
    context = Context(pool=ReferencePool(holed), image=STUB_IMAGE)
    outcome = check(SPEC, Sample(response="", files={"out.stl": stl(box())}), item, context)
    assert outcome.status == INFRA_ERROR and "is not a closed solid" in outcome.evidence


def test_a_sandbox_that_could_not_run_the_script_is_an_infra_error():
    item, _ = task(*BOX_TASK)
    context = Context(pool=ReferencePool(status=Status.INFRA_ERROR), image=STUB_IMAGE)
    outcome = check(SPEC, Sample(response="```python\nprint(1)\n```"), item, context)
    assert outcome.status == INFRA_ERROR and outcome.value is None


def test_the_reference_runs_once_per_script():
    item, context = task(*BOX_TASK)
    for _ in range(3):
        assert check(SPEC, Sample(response="", files={"out.stl": stl(box())}), item, context).value == 1.0
    assert len(context.pool.programs) == 1


# --- renders --------------------------------------------------------------------------------------------

def colour_share(png: bytes, half: str, colour: str) -> float:
    """Share of the panel's pixels in the candidate's blue or the reference's orange."""
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    panel = image[:, : image.shape[1] // 2] if half == "left" else image[:, image.shape[1] // 2:]
    red, blue = panel[..., 0], panel[..., 2]
    mask = (blue - red > 60) if colour == "blue" else (red - blue > 60)
    return mask.mean()


def test_each_view_is_a_png_of_both_solids():
    outcome = grade(stl(box()))
    assert set(outcome.artifacts) == {"render-iso.png", "render-front.png"}
    for png in outcome.artifacts.values():
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        assert Image.open(io.BytesIO(png)).size == (800, 400)
        assert colour_share(png, "left", "blue") > 0.03  # the candidate, drawn
        assert colour_share(png, "right", "orange") > 0.03  # the reference beside it
        assert colour_share(png, "left", "orange") == 0 and colour_share(png, "right", "blue") == 0


def test_different_solids_render_differently():
    def pixels(mesh):
        return np.asarray(Image.open(io.BytesIO(render(mesh, None, "iso"))).convert("L")).astype(int)

    box_image, cylinder_image = pixels(box()), pixels(cylinder())
    assert (np.abs(box_image - cylinder_image) > 40).mean() > 0.02
    assert (np.abs(box_image - pixels(box())) > 0).mean() == 0  # and the same solid the same way


def test_a_dense_mesh_is_rendered_coarsened_but_whole():
    dense = trimesh.creation.icosphere(subdivisions=6, radius=20)  # 81,920 faces
    png = render(dense, None, "top")
    assert colour_share(png, "left", "blue") > 0.1


# --- through the sandbox --------------------------------------------------------------------------------

CAD_IMAGE = SandboxImage(
    key="test/cad-3d@1",
    layers=({"type": "base", "image": "python-3.11-slim"},
            {"type": "python_packages", "packages": ["numpy==2.2.6", "trimesh==4.12.2", "manifold3d==3.3.2"]}),
    limits=Limits(cpus=1, cpu_seconds=60, wall_seconds=90, memory_mb=2048, max_processes=64, disk_mb=256),
    warm_pool_size=1)


@pytest.fixture(scope="module")
def cad_pool():
    with process_pool(CAD_IMAGE, heartbeat_interval=1.0) as pool:
        yield pool


def demo_cylinder() -> Item:
    instance = next(i for i in modelling3d.instances() if i["inputs"]["shape"] == "cylinder"
                    and i["inputs"]["placement"] == modelling3d.ON_FLOOR)
    return Item(key=instance["key"], inputs=instance["inputs"], hidden=instance["hidden"])


def cylinder_script(radius, height, sections=96) -> str:
    return ("Here is the script:\n\n```python\nimport trimesh\n\n"
            f"mesh = trimesh.creation.cylinder(radius={radius}, height={height}, sections={sections})\n"
            f"mesh.apply_translation([0, 0, {height} / 2])\nmesh.export('out.stl')\n```\n")


@pytest.mark.sandbox
def test_a_correct_script_run_in_the_sandbox_scores_one(cad_pool):
    item = demo_cylinder()
    radius, height = item.hidden["params"]["radius"], item.hidden["params"]["height"]
    outcome = check(SPEC, Sample(response=cylinder_script(radius, height)), item,
                    Context(pool=cad_pool, image=CAD_IMAGE))
    assert outcome.value == 1.0, outcome.evidence
    assert set(outcome.artifacts) == {"render-iso.png", "render-front.png"}


@pytest.mark.parametrize("script, value, says", [
    ("wider", 0.4, "extents: "),  # radius x 1.5: volume, extents and IoU fail
    ("```python\nimport trimesh\nraise SystemExit('cannot build it')\n```", 0, "cannot build it"),
    ("```python\nimport trimesh\nprint('done')\n```", 0, "wrote no out.stl"),
    ("```python\nopen('out.stl', 'wb').write(b'solid nothing')\n```", 0, "not an STL mesh"),
])
@pytest.mark.sandbox
def test_wrong_scripts_run_in_the_sandbox_score_below_one(cad_pool, script, value, says):
    item = demo_cylinder()
    if script == "wider":
        script = cylinder_script(item.hidden["params"]["radius"] * 1.5, item.hidden["params"]["height"])
    outcome = check(SPEC, Sample(response=script), item, Context(pool=cad_pool, image=CAD_IMAGE))
    assert outcome.value == pytest.approx(value), outcome.evidence
    assert says in outcome.evidence

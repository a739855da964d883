"""The `mesh_geometry` check: the candidate's solid against the task's reference, with rendered views.

Where the mesh comes from: `out.stl` among the sample's files, or else the last fenced Python block of the
response, run in the task's sandbox (never on this host) to write out.stl. The reference solid is the task's
`hidden["reference_script"]`, run in the sandbox too, once per script (the last 64 are kept in memory); a
reference that fails or is no closed solid is the task's fault, an infra_error, never a score.
The STL is untrusted data: it is size- and face-capped before trimesh parses it, and anything trimesh cannot
make a finite, non-empty mesh of scores 0 with the reason.

Sub-checks, each pass or fail, equal weights; the value is the fraction passed of those that apply:
- watertight (only if the spec requires it): a closed, consistently wound, outward-facing solid (trimesh's
  `is_volume`): no open or shared-by-three edges, no inside-out shell.
- volume: within `volume_rel_tolerance` of `hidden["volume"]` (else the reference solid's).
- extents: each axis of the bounding box within `bbox_abs_tolerance` of `hidden["extents"]`.
- position: each axis of the bounding-box centre within `bbox_abs_tolerance` of `hidden["bounds"]`' centre.
- iou: volume(candidate ∩ reference) / volume(candidate ∪ reference) >= `iou_threshold` (manifold3d).
Volume and IoU are properties of a solid: a mesh that is not closed fails them with that reason.
Extents are compared axis by axis, not sorted, and position counts, because the tasks name both: "width (X),
depth (Y), height (Z)", "axis along Z", "centred on the origin", "resting on the XY plane"
(apps/demo/modelling3d.py). A sub-check whose expected value the task lacks is left out.

Renders: one PNG per spec view, the candidate (blue) beside the reference (orange) on shared, equal axes, drawn
by matplotlib's Agg backend: no GPU or OpenGL. The vision judge reads them, so the axes keep their ticks.
"""

import hashlib
import io
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import trimesh
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from mpl_toolkits.mplot3d.art3d import Poly3DCollection

from workers.definitions.specs import MeshGeometry
from workers.sandbox import Execution, Status

from .types import INFRA_ERROR, Outcome
from .unit_tests import CODE_BLOCK

MAX_STL_BYTES = 50 * 1024 * 1024
MAX_FACES = 500_000  # the demo's finest reference has 20,480; booleans on more take seconds each
RENDER_FACES = 40_000  # above this, renders use a vertex-clustered copy: a 400-pixel panel shows no more
RENDER_SIZE = (8, 4)  # inches at 100 dpi: 800 x 400 pixels, candidate left, reference right
OUTPUT = "out.stl"

# (elevation, azimuth) of the camera, matplotlib's convention; the axis that points at the camera is hidden.
VIEWS = {"front": (0, -90, "y"), "side": (0, 0, "x"), "top": (90, -90, "z"), "iso": (30, -60, None)}
ZOOM = {"iso": 0.85}  # the slanted box needs room for its tick labels; the flat views fill the panel
CANDIDATE_COLOUR, REFERENCE_COLOUR = np.array([0.22, 0.45, 0.85]), np.array([0.90, 0.55, 0.18])

_references: OrderedDict[tuple, bytes] = OrderedDict()  # (image key, script sha256) -> the reference STL
_references_lock = threading.Lock()
_render_lock = threading.Lock()  # matplotlib's font and text caches are not thread-safe


class MeshRejected(Exception):
    """The bytes are not a mesh this check will grade; the message says why, for the evidence."""


@dataclass
class SubCheck:
    name: str
    passed: bool
    detail: str


def mesh_geometry_check(spec: MeshGeometry, sample, item, context) -> Outcome:
    data = sample.files.get(OUTPUT)
    if data is None:
        scripts = CODE_BLOCK.findall(sample.response)
        if not scripts:
            return Outcome.scored(0, f"no {OUTPUT} among the files and no ```python block in the response")
        if context.pool is None or context.image is None:
            return Outcome(value=None, status=INFRA_ERROR, evidence="no sandbox to run the candidate's script in")
        result = context.pool.execute(context.image, Execution(program=scripts[-1], collect=[OUTPUT]))
        if result.status == Status.INFRA_ERROR:
            return Outcome(value=None, status=INFRA_ERROR, evidence=result.reason)
        if result.status != Status.OK or OUTPUT not in result.files:
            what = f"ended {result.status}" + (f" ({result.reason})" if result.reason else "")
            if result.status == Status.OK:
                what = f"ran but wrote no {OUTPUT}"
            return Outcome.scored(0, f"the script {what}; stderr: {_tail(result.stderr)}")
        data = result.files[OUTPUT]
    try:
        candidate = load_stl(data)
    except MeshRejected as exc:
        return Outcome.scored(0, f"{OUTPUT}: {exc}")

    reference = None
    if item.hidden.get("reference_script"):
        try:
            reference = _reference_solid(item.hidden["reference_script"], context)
        except MeshRejected as exc:
            return Outcome(value=None, status=INFRA_ERROR, evidence=f"the task's reference script: {exc}")

    checks = sub_checks(spec, candidate, reference, item.hidden)
    if not checks:
        return Outcome(value=None, status=INFRA_ERROR, evidence="the task gives nothing to compare the mesh with "
                       "(no hidden volume, extents, bounds or reference_script) and the spec asks no watertightness")
    failed = [c for c in checks if not c.passed]
    evidence = f"{len(checks) - len(failed)}/{len(checks)} sub-checks passed"
    evidence += "".join(f"; {c.name}: {c.detail}" for c in failed)
    if len(failed) < len(checks):
        evidence += "; passed: " + ", ".join(f"{c.name} ({c.detail})" for c in checks if c.passed)
    if reference is None:
        evidence += "; iou: not checked (the task has no reference_script)"
    artifacts = {}
    for view in spec.render_views:
        try:
            artifacts[f"render-{view}.png"] = render(candidate, reference, view)
        except Exception as exc:  # a picture is for people; its failure must not change the score
            evidence += f"; render-{view}: failed ({type(exc).__name__}: {exc})"
    return Outcome.scored((len(checks) - len(failed)) / len(checks), evidence, artifacts=artifacts)


def load_stl(data: bytes) -> trimesh.Trimesh:
    """A finite, non-empty mesh from untrusted STL bytes, or MeshRejected saying what is wrong with them."""
    if len(data) > MAX_STL_BYTES:
        raise MeshRejected(f"{len(data) / 2**20:.1f} MB is over the {MAX_STL_BYTES // 2**20} MB limit")
    # A binary STL declares its face count in bytes 80..84; an ASCII one ends each face with "endfacet".
    declared = int.from_bytes(data[80:84], "little") if len(data) >= 84 else 0
    faces = declared if len(data) == 84 + 50 * declared else data.count(b"endfacet")
    if faces > MAX_FACES:
        raise MeshRejected(f"{faces} faces is over the {MAX_FACES} limit")
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            mesh = trimesh.load_mesh(io.BytesIO(data), file_type="stl")
    except Exception as exc:  # trimesh raises whatever its parser hits on malformed input
        raise MeshRejected(f"not a readable STL file ({type(exc).__name__}: {str(exc)[:200]})")
    if not isinstance(mesh, trimesh.Trimesh) or len(mesh.faces) == 0:
        raise MeshRejected("not an STL mesh with at least one triangle")
    if not np.isfinite(mesh.vertices).all():
        raise MeshRejected("vertex coordinates that are NaN or infinite")
    return mesh


def sub_checks(spec: MeshGeometry, candidate: trimesh.Trimesh, reference: trimesh.Trimesh | None,
               hidden: dict) -> list[SubCheck]:
    solid = candidate.is_volume
    checks = []
    if spec.require_watertight:
        checks.append(SubCheck("watertight", solid, "closed and outward-facing" if solid else _why_open(candidate)))

    volume = hidden.get("volume", reference.volume if reference is not None else None)
    if volume:
        if not solid:
            checks.append(SubCheck("volume", False, "needs a closed solid"))
        else:
            error = (candidate.volume - volume) / volume
            checks.append(SubCheck("volume", abs(error) <= spec.volume_rel_tolerance,
                                   f"{candidate.volume:.6g} vs {volume:.6g} ({error:+.2%}, tolerance "
                                   f"{spec.volume_rel_tolerance:.2%})"))

    bounds = np.array(hidden["bounds"], dtype=float) if "bounds" in hidden else \
        (reference.bounds if reference is not None else None)
    extents = np.array(hidden["extents"], dtype=float) if "extents" in hidden else \
        (bounds[1] - bounds[0] if bounds is not None else None)
    tolerance = spec.bbox_abs_tolerance
    if extents is not None:
        checks.append(_per_axis("extents", candidate.extents, extents, tolerance))
    if bounds is not None:
        checks.append(_per_axis("position", candidate.bounds.mean(axis=0), bounds.mean(axis=0), tolerance))

    if reference is not None:
        if not solid:
            checks.append(SubCheck("iou", False, "needs a closed solid"))
        else:
            iou, problem = intersection_over_union(candidate, reference)
            if problem:
                checks.append(SubCheck("iou", False, problem))
            else:
                checks.append(SubCheck("iou", iou >= spec.iou_threshold,
                                       f"{iou:.4f} {'>=' if iou >= spec.iou_threshold else '<'} "
                                       f"{spec.iou_threshold}"))
    return checks


def intersection_over_union(a: trimesh.Trimesh, b: trimesh.Trimesh) -> tuple[float, str]:
    """(IoU, "") of two closed solids, or (0, why) when manifold3d will not intersect them."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # an empty intersection warns on its centre of mass
            common = trimesh.boolean.intersection([a, b], engine="manifold").volume
    except Exception as exc:  # manifold3d refuses meshes that trimesh still calls volumes (self-intersections)
        return 0.0, f"manifold3d could not intersect the solids ({type(exc).__name__}: {str(exc)[:200]})"
    union = a.volume + b.volume - common
    return (common / union if union > 0 else 0.0), ""


def render(candidate: trimesh.Trimesh, reference: trimesh.Trimesh | None, view: str) -> bytes:
    """An 800 x 400 PNG: the candidate left, the reference right, same scale, orthographic, Lambert-shaded."""
    elevation, azimuth, facing_axis = VIEWS[view]
    meshes = [m for m in (candidate, reference) if m is not None]
    low = np.min([m.bounds[0] for m in meshes], axis=0)
    high = np.max([m.bounds[1] for m in meshes], axis=0)
    centre, half = (low + high) / 2, max((high - low).max() / 2 * 1.05, 1e-6)
    with _render_lock:
        figure = Figure(figsize=RENDER_SIZE, dpi=100)
        FigureCanvasAgg(figure)
        figure.subplots_adjust(left=0.02, right=0.96, bottom=0.04, top=0.92, wspace=0.12)
        for column, (mesh, colour, title) in enumerate([(candidate, CANDIDATE_COLOUR, "candidate"),
                                                        (reference, REFERENCE_COLOUR, "reference")]):
            axes = figure.add_subplot(1, 2, column + 1, projection="3d")
            axes.set_proj_type("ortho")
            axes.view_init(elev=elevation, azim=azimuth)
            for axis in "xyz":
                getattr(axes, f"set_{axis}lim")(centre["xyz".index(axis)] - half, centre["xyz".index(axis)] + half)
                getattr(axes, f"set_{axis}label")("" if axis == facing_axis else axis.upper())
            if facing_axis:
                getattr(axes, f"set_{facing_axis}ticks")([])
            axes.set_box_aspect((1, 1, 1), zoom=ZOOM.get(view, 1.0))
            if mesh is None:
                axes.set_title("reference: none (no reference script)", fontsize=10)
                continue
            x, y, z = mesh.extents
            axes.set_title(f"{title}  {x:.4g} × {y:.4g} × {z:.4g}", fontsize=10)
            axes.add_collection3d(_shaded_faces(mesh, colour, elevation, azimuth))
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _shaded_faces(mesh: trimesh.Trimesh, colour, elevation: float, azimuth: float) -> Poly3DCollection:
    """Faces lit by a light above and beside the camera; for a closed solid, only those facing the camera."""
    e, a = np.radians(elevation), np.radians(azimuth)
    eye = np.array([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)])
    light = eye + np.array([0.3, -0.2, 0.5])
    light /= np.linalg.norm(light)
    if len(mesh.faces) > RENDER_FACES:
        triangles, normals = _coarsened(mesh)
    else:
        normals, valid = trimesh.triangles.normals(mesh.triangles)  # from the winding, not the file's normals
        triangles = mesh.triangles[valid]
    if mesh.is_volume:  # back faces of a closed solid are hidden anyway; fewer polygons, fewer sorting errors
        front = normals @ eye > -1e-9
        triangles, normals = triangles[front], normals[front]
    shade = (0.3 + 0.7 * np.abs(normals @ light))[:, None] * colour[None, :]
    return Poly3DCollection(triangles, facecolors=shade, edgecolors=shade, linewidths=0.4)


def _coarsened(mesh: trimesh.Trimesh) -> tuple[np.ndarray, np.ndarray]:
    """(triangles, normals) of a vertex-clustered copy with at most RENDER_FACES faces: a 400-pixel panel shows
    no more, and matplotlib draws about 40,000 faces a second. Each cluster sits at the mean of its vertices
    and keeps their mean normal, so curved surfaces stay smoothly shaded. Hand-written: trimesh's quadric
    decimation needs another compiled package, for pictures only."""
    vertices = mesh.vertices
    # Area-weighted vertex normals, by hand: trimesh's want scipy and crawl without it.
    crosses = np.repeat(np.cross(*np.diff(mesh.triangles, axis=1).transpose(1, 0, 2)), 3, axis=0)
    corners = mesh.faces.ravel()
    vertex_normals = np.stack([np.bincount(corners, weights=crosses[:, i], minlength=len(vertices))
                               for i in range(3)], axis=1)
    cells = 300
    for _ in range(8):
        step = max(mesh.extents.max(), 1e-9) / cells
        cell = np.floor((vertices - mesh.bounds[0]) / step).astype(np.int64)  # 0..cells on each axis
        _, cluster = np.unique(cell @ np.array([(cells + 1) ** 2, cells + 1, 1]), return_inverse=True)
        faces = cluster[mesh.faces]
        faces = faces[(faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 0] != faces[:, 2])]
        if len(faces) <= RENDER_FACES:
            break
        cells = max(8, int(cells * 0.9 * (RENDER_FACES / len(faces)) ** 0.5))
    count = np.bincount(cluster).astype(float)[:, None]
    centres = np.stack([np.bincount(cluster, weights=vertices[:, i]) for i in range(3)], axis=1) / count
    normals = np.stack([np.bincount(cluster, weights=vertex_normals[:, i]) for i in range(3)], axis=1)
    normals = normals[faces].sum(axis=1)
    normals /= np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-12)
    return centres[faces], normals


def _reference_solid(script: str, context) -> trimesh.Trimesh:
    key = (getattr(context.image, "key", None), hashlib.sha256(script.encode()).hexdigest())
    with _references_lock:
        data = _references.get(key)
        if data is not None:
            _references.move_to_end(key)
    if data is None:
        if context.pool is None or context.image is None:
            raise MeshRejected("no sandbox to run it in")
        result = context.pool.execute(context.image, Execution(program=script, collect=[OUTPUT]))
        if result.status != Status.OK or OUTPUT not in result.files:
            raise MeshRejected(f"ended {result.status} ({result.reason or f'no {OUTPUT}'}); "
                               f"stderr: {_tail(result.stderr)}")
        data = result.files[OUTPUT]
        with _references_lock:
            _references[key] = data
            while len(_references) > 64:
                _references.popitem(last=False)
    reference = load_stl(data)
    if not reference.is_volume:
        raise MeshRejected(f"its {OUTPUT} is not a closed solid ({_why_open(reference)})")
    return reference


def _why_open(mesh: trimesh.Trimesh) -> str:
    _, uses = np.unique(mesh.edges_sorted, axis=0, return_counts=True)
    open_edges, crowded = int((uses == 1).sum()), int((uses > 2).sum())
    if open_edges or crowded:
        return f"not closed: {open_edges} open edges, {crowded} edges shared by more than two faces"
    if not mesh.is_winding_consistent:
        return "closed, but its faces are not wound consistently"
    return f"closed, but inside out (volume {mesh.volume:.6g}): its faces point inwards"


def _per_axis(name: str, measured, expected, tolerance: float) -> SubCheck:
    """Extents read "40 × 20 × 10"; a position reads "centre (0, 0, 5)"."""
    def shown(values):
        text = [f"{v:.6g}" for v in values]
        return " × ".join(text) if name == "extents" else f"centre ({', '.join(text)})"

    off = np.abs(np.asarray(measured) - expected)
    if (off <= tolerance).all():
        return SubCheck(name, True, shown(measured))
    worst = int(off.argmax())
    return SubCheck(name, False, f"{shown(measured)}, expected {shown(expected)} ± {tolerance:g} "
                                 f"({'XYZ'[worst]} off by {off[worst]:.4g})")


def _tail(stderr: bytes, size: int = 600) -> str:
    text = stderr.decode("utf-8", "replace").strip()
    return ("…" + text[-size:]) if len(text) > size else (text or "(empty)")

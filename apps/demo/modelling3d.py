"""3D modelling: write a trimesh script that builds a primitive solid and exports it to out.stl.

References are computed from closed-form formulas (no trimesh at seed time). Tessellated curved surfaces come
out slightly smaller than the formula (about 0.1% with the sections used in the reference scripts), well
inside the verifier's volume tolerance.
"""

import math
import random

from workers.rl.rollout.tools import RUN_PYTHON_TOOL

from .draft import Draft

SEED = 31415
PER_SHAPE = 45

PROMPT = ("Write a Python script that uses trimesh to create {solid} with {dimensions}, {placement}. "
          "Lengths are in millimetres. Export the mesh to out.stl.")

CENTRED = "centred on the origin"
ON_FLOOR = "resting on the XY plane (its lowest point at z = 0) and centred on the Z axis"


def _box(rng):
    w, d, h = rng.randint(5, 80), rng.randint(5, 80), rng.randint(2, 60)
    placement = rng.choice([CENTRED, ON_FLOOR])
    z0 = -h / 2 if placement == CENTRED else 0.0
    script = (f"mesh = trimesh.creation.box(extents=[{w}, {d}, {h}])\n"
              + ("" if placement == CENTRED else f"mesh.apply_translation([0, 0, {h / 2}])\n"))
    return ("box", "a rectangular box", f"width {w} (X), depth {d} (Y) and height {h} (Z)", placement,
            {"width": w, "depth": d, "height": h}, w * d * h,
            [[-w / 2, -d / 2, z0], [w / 2, d / 2, z0 + h]], script)


def _cylinder(rng):
    r, h = rng.randint(2, 40), rng.randint(2, 80)
    placement = rng.choice([CENTRED, ON_FLOOR])
    z0 = -h / 2 if placement == CENTRED else 0.0
    script = (f"mesh = trimesh.creation.cylinder(radius={r}, height={h}, sections=128)\n"
              + ("" if placement == CENTRED else f"mesh.apply_translation([0, 0, {h / 2}])\n"))
    return ("cylinder", "a solid cylinder with its axis along Z", f"radius {r} and height {h}", placement,
            {"radius": r, "height": h}, math.pi * r * r * h, [[-r, -r, z0], [r, r, z0 + h]], script)


def _sphere(rng):
    r = rng.randint(2, 60)
    placement = rng.choice([CENTRED, ON_FLOOR])
    z0 = -r if placement == CENTRED else 0.0
    script = (f"mesh = trimesh.creation.icosphere(subdivisions=5, radius={r})\n"
              + ("" if placement == CENTRED else f"mesh.apply_translation([0, 0, {r}])\n"))
    return ("sphere", "a solid sphere", f"radius {r}", placement, {"radius": r}, 4 / 3 * math.pi * r ** 3,
            [[-r, -r, z0], [r, r, z0 + 2 * r]], script)


def _l_bracket(rng):
    t = rng.randint(2, 10)
    a, b, w = rng.randint(t + 5, 90), rng.randint(t + 5, 90), rng.randint(5, 60)
    script = (f"base = trimesh.creation.box(bounds=[[0, 0, 0], [{a}, {w}, {t}]])\n"
              f"upright = trimesh.creation.box(bounds=[[0, 0, 0], [{t}, {w}, {b}]])\n"
              "mesh = trimesh.boolean.union([base, upright], engine=\"manifold\")\n")
    return ("l-bracket", "an L-bracket (a horizontal leg along +X and a vertical leg along +Z, joined at the "
            "origin edge)", f"horizontal leg length {a}, vertical leg height {b}, width {w} (Y) and wall thickness "
            f"{t}", "with the outer corner of the L at the origin and the whole part in x, y, z >= 0",
            {"leg_length": a, "leg_height": b, "width": w, "thickness": t}, w * t * (a + b - t),
            [[0, 0, 0], [a, w, b]], script)


def _plate_with_hole(rng):
    w, d, t = rng.randint(20, 120), rng.randint(20, 120), rng.randint(2, 12)
    hole = rng.randint(3, min(w, d) - 10)
    script = (f"plate = trimesh.creation.box(extents=[{w}, {d}, {t}])\n"
              f"hole = trimesh.creation.cylinder(radius={hole / 2}, height={t + 2}, sections=128)\n"
              "mesh = plate.difference(hole, engine=\"manifold\")\n")
    return ("plate-with-hole", "a rectangular plate with a round through-hole along Z at its centre",
            f"width {w} (X), depth {d} (Y), thickness {t} (Z) and hole diameter {hole}", CENTRED,
            {"width": w, "depth": d, "thickness": t, "hole_diameter": hole},
            w * d * t - math.pi * (hole / 2) ** 2 * t, [[-w / 2, -d / 2, -t / 2], [w / 2, d / 2, t / 2]], script)


SHAPES = [_box, _cylinder, _sphere, _l_bracket, _plate_with_hole]


def _float(x: float) -> float:
    return round(float(x), 6)


def instances() -> list[dict]:
    rng, items = random.Random(SEED), []
    for make in SHAPES:
        seen = set()
        while len(seen) < PER_SHAPE:
            shape, solid, dimensions, placement, params, volume, bounds, body = make(rng)
            if (dimensions, placement) in seen:
                continue
            seen.add((dimensions, placement))
            lower, upper = ([_float(v) for v in corner] for corner in bounds)
            items.append({
                "key": f"{shape}-{len(seen):03d}",
                "inputs": {"shape": shape, "solid": solid, "dimensions": dimensions, "placement": placement},
                "hidden": {
                    "params": params,
                    "volume": _float(volume),
                    "bounds": [lower, upper],
                    "extents": [_float(hi - lo) for lo, hi in zip(lower, upper, strict=True)],
                    "watertight": True,
                    "reference_script": f"import trimesh\n\n{body}mesh.export(\"out.stl\")\n",
                },
            })
    return items


def drafts() -> list[Draft]:
    template = {
        "system_prompt": "You write Python scripts that build 3D meshes with trimesh. Reply with one complete "
                         "script in a ```python block; it runs in a sandbox with trimesh and manifold3d.",
        "prompt_template": PROMPT,
        "tools": [RUN_PYTHON_TOOL],
        "sandbox_image": "cad-3d",
        "verifier": "mesh-geometry",
        "limits": {"max_turns": 6, "max_tokens": 4096, "max_seconds": 180},
    }
    return [
        Draft("task_template", "primitive-solids", "Boxes, cylinders, spheres, L-brackets and plates with a hole, "
              "built with trimesh and checked by volume, bounding box and renders.", template, instances()),
        Draft("domain", "3d-modelling", "Scripted CAD: meshes checked by geometry and rendered views.",
              {"sampling_weight": 1.0, "templates": [{"template": "primitive-solids", "weight": 1.0}]}),
    ]

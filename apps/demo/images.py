"""Sandbox images of the demo: plain Python, Python with the report corpus mounted, and a CAD toolchain."""

from .docqa import corpus, corpus_files
from .draft import Draft

BASE = {"type": "base", "image": "python-3.11-slim"}

PYTHON = {
    "layers": [BASE, {"type": "python_packages", "packages": ["numpy==2.2.6", "sympy==1.13.3"]}],
    "limits": {"cpus": 1, "cpu_seconds": 20, "memory_mb": 512, "wall_seconds": 30, "max_processes": 32,
               "disk_mb": 256, "network": False},
    # Coding and arithmetic rollouts are short and numerous: keep enough sandboxes warm to hide assembly time.
    "warm_pool_size": 16,
}

CAD = {
    "layers": [BASE, {"type": "python_packages",
                      "packages": ["numpy==2.2.6", "trimesh==4.12.2", "manifold3d==3.3.2"]}],
    "limits": {"cpus": 2, "cpu_seconds": 60, "memory_mb": 2048, "wall_seconds": 120, "max_processes": 64,
               "disk_mb": 512, "network": False},
    "warm_pool_size": 4,
}


def docqa_image() -> dict:
    return {
        "layers": [BASE, {"type": "files", "files": corpus_files(corpus())}],
        "limits": {"cpus": 1, "cpu_seconds": 10, "memory_mb": 256, "wall_seconds": 30, "max_processes": 16,
                   "disk_mb": 64, "network": False},
        "warm_pool_size": 8,
    }


def drafts() -> list[Draft]:
    return [
        # Slugs cannot hold a dot, so the Python 3.11 image is python-3-11.
        Draft("sandbox_image", "python-3-11", "Python 3.11 with numpy and sympy; no network.", PYTHON),
        Draft("sandbox_image", "docqa-corpus", "Python 3.11 with the synthetic annual reports mounted under "
              "docs/.", docqa_image()),
        Draft("sandbox_image", "cad-3d", "Python 3.11 with trimesh and manifold3d for building and exporting "
              "meshes.", CAD),
    ]

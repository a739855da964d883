"""Where trajectory artifacts (rendered screenshots, logs) live: files under STUDIO_DATA_DIR/artifacts.

The archive row keeps only names and paths; this is the seam an S3-compatible store would fit (put/open by
key). Keys are derived from the trajectory id, so writing a replayed trajectory's artifacts again overwrites
the same files instead of leaving orphans.
"""

from __future__ import annotations

import mimetypes
import os
from pathlib import Path

from django.conf import settings


def artifact_root() -> Path:
    return Path(settings.DATA_DIR) / "artifacts"


def artifact_key(*, run_id, trajectory_id, name: str) -> str:
    safe = "/".join(part for part in name.replace("\\", "/").split("/") if part not in ("", ".", ".."))
    return f"{run_id}/{trajectory_id}/{safe}"


def artifact_put(*, key: str, content: bytes) -> dict:
    path = artifact_root() / key
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(content)
    os.replace(temporary, path)
    content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return {"name": key.split("/", 2)[2], "key": key, "content_type": content_type, "bytes": len(content)}


def artifact_open(*, key: str):
    root = artifact_root().resolve()
    path = (root / key).resolve()
    if root not in path.parents:
        raise FileNotFoundError(key)
    return path.open("rb")

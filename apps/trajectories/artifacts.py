"""Where trajectory artifacts (rendered screenshots, logs) live: `artifacts/<run>/<trajectory>/<name>` in the blob
storage (apps/common/wiring.blob_storage: the data directory, or an S3-compatible bucket every host shares), so
the replay page on the web host shows a render a worker host wrote.

The archive row keeps only names and keys. Keys are derived from the trajectory id, so writing a replayed
trajectory's artifacts again overwrites the same blobs instead of leaving orphans.
"""

from __future__ import annotations

import mimetypes

from apps.common.wiring import blob_storage
from workers.storage import Storage


def artifact_storage() -> Storage:
    return blob_storage().child("artifacts")


def artifact_key(*, run_id, trajectory_id, name: str) -> str:
    safe = "/".join(part for part in name.replace("\\", "/").split("/") if part not in ("", ".", ".."))
    return f"{run_id}/{trajectory_id}/{safe}"


def artifacts_put(*, contents: dict[str, bytes]) -> dict[str, dict]:
    """Write the artifacts (key -> bytes), all at once: on an object store the PUTs go concurrently, not one by
    one inside the step's transaction. Returns each key's archive entry (name, key, content type, size)."""
    artifact_storage().write_many(contents)
    return {key: {"name": key.split("/", 2)[2], "key": key, "bytes": len(content),
                  "content_type": mimetypes.guess_type(key.rsplit("/", 1)[-1])[0] or "application/octet-stream"}
            for key, content in contents.items()}


def artifact_open(*, key: str):
    """The artifact's bytes as a binary file object; FileNotFoundError if the store has no such blob (or the key
    would leave the artifact store)."""
    try:
        return artifact_storage().open(key)
    except ValueError:
        raise FileNotFoundError(key) from None

"""Blobs (checkpoints, artifacts, converted models, exports) through fsspec: a local directory or an S3-compatible
bucket, one interface for both (blobs.py). No Django here."""

from .blobs import MANIFEST, Storage, StorageChanged, StorageUnavailable, check_key

__all__ = ["MANIFEST", "Storage", "StorageChanged", "StorageUnavailable", "check_key"]

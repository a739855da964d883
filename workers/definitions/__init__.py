"""The definitions kernel: typed specs per kind and canonical hashing, with no Django.

The registry (apps/registry) stores and versions definitions; the engine reads their specs. Both import the
rules from here, so the arrow points from apps/ to workers/, never back.
"""

from .canonical import canonical_json, content_hash
from .specs import KINDS, SPEC_SCHEMA_VERSION, FieldError, SpecError, validate_spec

__all__ = ["KINDS", "SPEC_SCHEMA_VERSION", "FieldError", "SpecError", "canonical_json", "content_hash",
           "validate_spec"]

"""Layered verification: exact checks, environment feedback, an LLM judge; see pipeline.py. No Django here."""

from .pipeline import verify, verify_group
from .types import Context, Item, Outcome, Sample, Verdict

__all__ = ["Context", "Item", "Outcome", "Sample", "Verdict", "verify", "verify_group"]

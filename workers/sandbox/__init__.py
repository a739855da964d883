"""Sandboxes for model-written code: a warm pool over pluggable backends. No Django here."""

from .pool import AcquireTimeout, ImageUnavailable, Lease, LeaseExpired, SandboxPool
from .types import DEFAULT_IMAGE, Execution, ExecutionResult, Limits, NetworkRefused, SandboxImage, Status

__all__ = ["AcquireTimeout", "DEFAULT_IMAGE", "Execution", "ExecutionResult", "ImageUnavailable", "Lease",
           "LeaseExpired", "Limits", "NetworkRefused", "SandboxImage", "SandboxPool", "Status"]

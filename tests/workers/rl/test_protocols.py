"""The engine's seams (workers/rl/protocols.py) hold for every implementation: each has every method a protocol
lists, taking the parameters the callers pass, and every attribute it lists — so a caller typed against a
protocol can be handed any of them. Checked on the classes, without building a model or a server."""

import inspect
import re
import typing

import pytest

from workers.remote import RemoteToolRunner, RemoteToolSession, RemoteVerifier
from workers.rl import protocols
from workers.rl.engines.endpoint import EndpointEngine, MessagesChat
from workers.rl.engines.hf import TransformersEngine
from workers.rl.engines.ranks import RanksEngine
from workers.rl.engines.server import ServerEngine
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.engines.vllm_engine import VLLMEngine
from workers.rl.models.chat_formats import CharChat, HFChat
from workers.rl.models.policies import HFPolicy, TinyLMPolicy
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.rollout.sessions import LocalToolSession
from workers.rl.rollout.tools import SandboxToolRunner
from workers.rl.training.tracking import MemoryTracker

IMPLEMENTATIONS = [
    *[(protocols.Engine, engine) for engine in (TorchEngine, TransformersEngine, VLLMEngine, ServerEngine,
                                                 EndpointEngine, RanksEngine)],
    (protocols.Policy, TinyLMPolicy), (protocols.Policy, HFPolicy),
    (protocols.ChatFormat, CharChat), (protocols.ChatFormat, HFChat), (protocols.ChatFormat, MessagesChat),
    (protocols.TrainingChat, CharChat), (protocols.TrainingChat, HFChat),
    (protocols.ToolRunner, SandboxToolRunner), (protocols.ToolRunner, RemoteToolRunner),
    (protocols.ToolSession, LocalToolSession), (protocols.ToolSession, RemoteToolSession),
    (protocols.Verifier, LocalVerifier), (protocols.Verifier, RemoteVerifier),
    (protocols.Tracker, MemoryTracker),
]


def members(protocol) -> tuple[list[str], list[str]]:
    """(methods, attributes) a protocol lists."""
    methods = [name for name, value in vars(protocol).items() if inspect.isfunction(value) and name[0] != "_"]
    return methods, list(typing.get_type_hints(protocol, localns=vars(protocols)))


def sets_attribute(cls, name: str) -> bool:
    """A class attribute, a dataclass field, or `self.<name>` assigned in a method of the class or its bases."""
    if any(name in vars(klass) or name in getattr(klass, "__annotations__", {}) for klass in cls.__mro__):
        return True
    assigned = re.compile(rf"self\.{name}\b[^=\n]*=(?!=)|self\.\w+(, self\.\w+)*, self\.{name}\b[^=\n]*=(?!=)")
    return any(assigned.search(inspect.getsource(klass)) for klass in cls.__mro__ if klass is not object)


def problems_with(protocol, cls, name: str) -> list[str]:
    """Why `cls.name` cannot stand in for `protocol.name`: parameters the callers pass that it does not take,
    and parameters of its own they do not pass and it gives no default."""
    wanted = inspect.signature(getattr(protocol, name))
    given = inspect.signature(getattr(cls, name))
    taken = given.parameters
    open_keywords = any(p.kind == p.VAR_KEYWORD for p in taken.values())
    problems = []
    for parameter in list(wanted.parameters.values())[1:]:
        mine = taken.get(parameter.name)
        if mine is None and not open_keywords:
            problems.append(f"takes no {parameter.name!r}")
        elif mine is not None and mine.kind != parameter.kind and not (
                parameter.kind == parameter.KEYWORD_ONLY and mine.kind == mine.POSITIONAL_OR_KEYWORD):
            problems.append(f"takes {parameter.name!r} as {mine.kind.description}, not {parameter.kind.description}")
        elif mine is not None and parameter.default is not parameter.empty and mine.default is mine.empty:
            problems.append(f"needs {parameter.name!r}, which callers may leave out")
    for extra in [p for p in list(taken.values())[1:] if p.name not in wanted.parameters]:
        if extra.default is extra.empty and extra.kind not in (extra.VAR_POSITIONAL, extra.VAR_KEYWORD):
            problems.append(f"needs {extra.name!r}, which callers never pass")
    return problems


@pytest.mark.parametrize(("protocol", "cls"), IMPLEMENTATIONS,
                         ids=[f"{p.__name__}-{c.__name__}" for p, c in IMPLEMENTATIONS])
def test_every_implementation_has_what_its_protocol_lists(protocol, cls):
    methods, attributes = members(protocol)
    assert methods or attributes
    missing = [name for name in methods if not callable(getattr(cls, name, None))]
    missing += [name for name in attributes if not sets_attribute(cls, name)]
    assert not missing, f"{cls.__name__} lacks {missing} of {protocol.__name__}"
    problems = {name: found for name in methods if (found := problems_with(protocol, cls, name))}
    assert not problems, f"{cls.__name__} differs from {protocol.__name__}: {problems}"


def test_a_protocol_with_a_method_an_implementation_lacks_is_caught():
    class Narrow(typing.Protocol):
        def generate(self, requests, *, priority: int) -> list: ...

    assert problems_with(Narrow, TorchEngine, "generate") == ["takes no 'priority'"]
    assert not sets_attribute(TorchEngine, "temperature") and sets_attribute(ServerEngine, "max_context")

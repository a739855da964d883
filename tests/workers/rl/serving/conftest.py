"""`serve`'s app on the tiny model, under uvicorn on the loopback, for the tests that speak to it over HTTP."""

import copy
import socket
import threading
import time
from contextlib import contextmanager

import pytest
import uvicorn

from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.serving.app import build_app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app):
    """`app` under uvicorn in a thread, for the block: its base URL (/v1)."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(5)


@pytest.fixture
def served(addition_base_model):
    """The tiny model behind `serve`'s app under uvicorn in a thread; yields its base URL."""
    engine = TorchEngine(copy.deepcopy(addition_base_model))
    with serving(build_app(engine=engine, chat=CharChat(), model_name="tiny-adder")) as url:
        yield url
    engine.close()

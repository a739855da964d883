"""The studio's ASGI app (HTTP and websockets) served by daphne from a thread of this process.

For the browser tests and `bench ui`: the embedded studio trains in a thread of its web process, and with the
in-memory channel layer only a server in the same process can receive what a worker thread broadcasts. With
REDIS_URL the same server hears broadcasts from anywhere. Twisted's reactor runs once per process, so start
this once (a session fixture) and stop it at the end.
"""

from __future__ import annotations

import importlib
import threading
import time

import daphne.server  # noqa: F401  (installs the asyncio reactor before anything imports twisted's default)


class ThreadedServer:
    def __init__(self, host: str = "127.0.0.1"):
        from channels.routing import get_default_application
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from django.conf import settings

        # Every view imported before the first request, not by it: the URLconf pulls in the whole studio (torch
        # and Dash included), 10-30 s on a loaded machine, longer than a browser test's page timeout.
        importlib.import_module(settings.ROOT_URLCONF)
        # settings.ASGI_APPLICATION, as `runserver` finds it (HTTP and websockets)
        self.server = Server(application=get_default_application(), signal_handlers=False, verbosity=0,
                             endpoints=build_endpoint_description_strings(host=host, port=0))
        self.thread = threading.Thread(target=self.server.run, name="asgi-server", daemon=True)

    def start(self, timeout: float = 10.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.listening_addresses:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the ASGI server did not start listening")
            time.sleep(0.02)
        host, port = self.server.listening_addresses[0]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        from twisted.internet import reactor

        if reactor.running:
            reactor.callFromThread(reactor.stop)
        self.thread.join(timeout=10)

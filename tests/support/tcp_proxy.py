"""A TCP proxy a test can cut and restore, to put a network outage between the code under test and a server (the
S3 test server): `cut()` closes the listening socket and every open connection, so new ones are refused and those
in flight reset; `restore()` listens on the same port again. Hand-written: a few dozen lines of sockets and
threads, where a fault-injection proxy (toxiproxy) would be a server of its own to install and run."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse


class TcpProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = 0
        self.requests: list[bytes] = []  # the first bytes of each chunk a client sent ("PUT /bucket/key ...")
        self.request_seen = threading.Condition()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        """Listen (again, on the same port) and forward what arrives."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port, self._listener = listener.getsockname()[1], listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """The server goes away: connections are refused, and the open ones are reset."""
        with self._lock:
            listener, self._listener = self._listener, None
            open_sockets, self._sockets = self._sockets, set()
        if listener is not None:
            listener.close()
        for connection in open_sockets:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()

    def wait_for_request(self, prefix: bytes, *, seconds: float = 30) -> bool:
        """Whether a client sends a chunk starting with `prefix` (b"PUT ") within `seconds`."""
        with self.request_seen:
            return self.request_seen.wait_for(lambda: any(r.startswith(prefix) for r in self.requests), seconds)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut while this one was being connected
                    client.close()
                    server.close()
                    return
                self._sockets |= {client, server}
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if from_client:
                    with self.request_seen:
                        self.requests.append(chunk[:64])
                        self.request_seen.notify_all()
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):  # either side closing ends the connection both ways
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._sockets.discard(source)
            source.close()  # each socket is the source of one of the connection's two pipes


@contextmanager
def s3_behind_proxy() -> Iterator[TcpProxy]:
    """The S3 test server (object_store.py; the test's `object_store` fixture set AWS_ENDPOINT_URL_S3) reached
    through a TcpProxy for the block. s3fs file systems made before are forgotten at both ends of it: fsspec keeps
    one per set of options, bound to the endpoint it was made with."""
    from s3fs import S3FileSystem

    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL_S3"])
    proxy = TcpProxy(endpoint.hostname, endpoint.port)
    os.environ["AWS_ENDPOINT_URL_S3"] = proxy.url
    S3FileSystem.clear_instance_cache()
    try:
        yield proxy
    finally:
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoint.geturl()
        S3FileSystem.clear_instance_cache()
        proxy.cut()

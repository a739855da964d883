"""The host's end of the zygote protocol: length-prefixed JSON over the sandbox's stdin and stdout."""

import json
import os
import select
import struct
import time


class ChannelClosed(Exception):
    """The sandbox's end is gone: its process died."""


class ChannelTimeout(Exception):
    """Nothing arrived in time."""


class Channel:
    def __init__(self, write_fd: int, read_fd: int):
        self.write_fd, self.read_fd = write_fd, read_fd
        self._buffer = bytearray()

    def send(self, message: dict) -> None:
        body = json.dumps(message).encode()
        data = struct.pack(">I", len(body)) + body
        try:
            while data:
                written = os.write(self.write_fd, data)
                data = data[written:]
        except (BrokenPipeError, OSError) as exc:
            raise ChannelClosed(str(exc)) from None

    def receive(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            if len(self._buffer) >= 4:
                size = struct.unpack(">I", self._buffer[:4])[0]
                if len(self._buffer) >= 4 + size:
                    body = bytes(self._buffer[4:4 + size])
                    del self._buffer[:4 + size]
                    return json.loads(body)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout()
            ready, _, _ = select.select([self.read_fd], [], [], remaining)
            if not ready:
                raise ChannelTimeout()
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise ChannelClosed("the sandbox closed its end")
            self._buffer += chunk

"""A stand-in for a server an editor runs: an OpenAI-compatible chat completions endpoint on this machine that
records every request it gets (path and Authorization header), so a test can say what left the studio. `/moved/`
answers a redirect to the URL given as `?to=`."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class RecordingServer:
    def __init__(self, host: str = "127.0.0.1"):
        self.requests: list[tuple[str, str]] = []  # (path, Authorization header or "")
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                server.requests.append((self.path, self.headers.get("Authorization", "")))
                if self.path.startswith("/moved/"):
                    self.send_response(307)
                    self.send_header("Location", parse_qs(urlsplit(self.path).query)["to"][0])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                answer = json.dumps({
                    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
                    "choices": [{"index": i, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}
                                for i in range(body.get("n", 1))],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def authorizations(self) -> set[str]:
        return {authorization for _, authorization in self.requests}

"""A real OpenAI-compatible HTTP server on 127.0.0.1 for judge tests: scripted replies, then a
default reply computed from the request body; every request is recorded (path, headers, body)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    content: str | None = None  # chat content; wrapped in an OpenAI response body
    raw: str | None = None  # a raw body instead
    delay: float = 0.0


@dataclass
class FakeOpenAI:
    """Scripted replies (then `default(request_body)`), and every request it received."""

    port: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    script: list[Reply] = field(default_factory=list)
    default: Callable[[dict[str, Any]], Reply] = lambda body: Reply(content='{"score_value": "False"}')
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def chat_body(content: str) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        }
    )


@contextmanager
def running_fake_openai() -> Iterator[FakeOpenAI]:
    """A ``FakeOpenAI`` serving on an ephemeral port of 127.0.0.1 for the duration of the block."""
    state = FakeOpenAI()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            with state.lock:
                state.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                reply = state.script.pop(0) if state.script else state.default(body)
            if reply.delay:
                time.sleep(reply.delay)
            payload = (reply.raw if reply.raw is not None else chat_body(reply.content or "")).encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out and went away

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)

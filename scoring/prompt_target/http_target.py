"""HTTPTarget: send a prompt inside a raw HTTP request template (PyRIT's ``HTTPTarget``).

    target = HTTPTarget(
        http_request="POST /chat HTTP/1.1\\nHost: agent.example\\nContent-Type: text/plain\\n\\n{PROMPT}",
        trace_config=TargetTraceConfig(enabled=True),
    )

The template is a request line, headers and a body; ``{PROMPT}`` (``prompt_regex_string``)
is replaced by the prompt wherever it appears. The URL is ``https://<Host><path>``
(``http`` with ``use_tls=False``), or the request line's absolute URL. ``Content-Length``
is computed, never taken from the template.

Tracing is off by default, because an arbitrary HTTP endpoint is not known to accept W3C
trace context. With ``TargetTraceConfig(enabled=True)`` each request carries a fresh
``traceparent`` and the request piece saves the same trace id; supplying ``traceparent`` or
``tracestate`` in the template at the same time is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from scoring.models.message import Message, MessagePiece
from scoring.prompt_target.base import PromptTarget, traces_itself
from scoring.prompt_target.tracing import TRACE_HEADERS, TargetTraceConfig, request_trace

__all__ = ["HTTPTarget", "ParsedRequest", "parse_http_request"]

_REQUEST_LINE = re.compile(r"^(?P<method>[A-Za-z]+)\s+(?P<target>\S+)(?:\s+(?P<version>HTTP/[\d.]+))?\s*$")
_SKIPPED_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: str

    def url(self, use_tls: bool) -> str:
        if re.match(r"^https?://", self.target, re.I):
            return self.target
        host = next((v for k, v in self.headers if k.lower() == "host"), "")
        if not host:
            raise ValueError("the HTTP request template needs a Host header or an absolute URL")
        path = self.target if self.target.startswith("/") else "/" + self.target
        return f"{'https' if use_tls else 'http'}://{host}{path}"


def parse_http_request(raw: str) -> ParsedRequest:
    """Split a raw HTTP request (``\\n`` or ``\\r\\n`` line ends) into its parts."""
    cut = [i for i in (raw.find("\r\n\r\n"), raw.find("\n\n")) if i >= 0]
    if cut:
        at = min(cut)
        head, body = raw[:at], raw[at + (4 if raw.startswith("\r\n\r\n", at) else 2):]
    else:
        head, body = raw, ""
    lines = [line.rstrip("\r") for line in head.strip("\r\n").split("\n")]
    m = _REQUEST_LINE.match(lines[0]) if lines else None
    if m is None:
        raise ValueError(f"not an HTTP request line: {lines[0] if lines else ''!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"not an HTTP header line: {line!r}")
        headers.append((name.strip(), value.strip()))
    return ParsedRequest(m["method"].upper(), m["target"], tuple(headers), body)


class HTTPTarget(PromptTarget):
    """A prompt target behind a raw HTTP request template (see the module docstring)."""

    def __init__(
        self,
        http_request: str,
        *,
        prompt_regex_string: str = "{PROMPT}",
        use_tls: bool = True,
        callback_function: Callable[[httpx.Response], str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 60.0,
        trace_config: TargetTraceConfig | None = None,
        **httpx_client_kwargs: Any,
    ) -> None:
        super().__init__(trace_config=trace_config)
        if not prompt_regex_string:
            raise ValueError("prompt_regex_string must not be empty")
        self.http_request = http_request
        self._template = parse_http_request(http_request)
        self._placeholder = prompt_regex_string
        self._use_tls = use_tls
        self._callback = callback_function
        self._transport = transport
        self._timeout = timeout
        self._client_kwargs = httpx_client_kwargs
        self._client: httpx.AsyncClient | None = None
        self._check_trace_headers(self._template.headers)
        self._template.url(use_tls)  # fail early on a template without Host

    def _check_trace_headers(self, headers: tuple[tuple[str, str], ...]) -> None:
        if not self.trace_config.enabled:
            return
        manual = sorted({k.lower() for k, _ in headers} & TRACE_HEADERS)
        if manual:
            raise ValueError(
                f"the HTTP request supplies {', '.join(manual)} while TargetTraceConfig(enabled=True) sends a fresh "
                "traceparent per request: keep tracing disabled if you supply trace context headers yourself"
            )

    def _render(self, prompt: str) -> ParsedRequest:
        p, t = self._placeholder, self._template
        headers = tuple((k.replace(p, prompt), v.replace(p, prompt)) for k, v in t.headers)
        self._check_trace_headers(headers)
        return ParsedRequest(t.method, t.target.replace(p, prompt), headers, t.body.replace(p, prompt))

    async def _send(self, request: httpx.Request) -> httpx.Response:
        if self._transport is not None:
            # The caller owns the transport (and closes it): this client is never closed, because
            # closing a client closes its transport.
            if self._client is None:
                self._client = httpx.AsyncClient(transport=self._transport, timeout=self._timeout,
                                                 **self._client_kwargs)
            response = await self._client.send(request)
            await response.aread()
            return response
        async with httpx.AsyncClient(timeout=self._timeout, **self._client_kwargs) as owned:
            response = await owned.send(request)
            await response.aread()
            return response

    @traces_itself
    async def send_prompt_async(self, *, message: Message) -> Message:
        piece = message.message_pieces[0]
        rendered = self._render(piece.converted_value)
        headers = [(k, v) for k, v in rendered.headers if k.lower() not in _SKIPPED_HEADERS]
        with request_trace(self.trace_config, f"{rendered.method}") as rt:
            if rt is not None:
                piece.trace_id = rt.trace_id
                headers.extend(rt.headers.items())
            request = httpx.Request(
                rendered.method,
                rendered.url(self._use_tls),
                headers=headers,
                content=rendered.body.encode("utf-8") if rendered.body else None,
            )
            try:
                response = await self._send(request)
            except Exception as exc:
                if rt is not None:
                    rt.error = type(exc).__name__
                raise
            if rt is not None:
                rt.status_code = response.status_code
        text = self._callback(response) if self._callback is not None else response.text
        return Message(
            message_pieces=[
                MessagePiece(
                    role="assistant",
                    original_value=text,
                    conversation_id=piece.conversation_id,
                    labels={**piece.labels, "http_status": str(response.status_code)},
                )
            ]
        )

    def get_identifier(self) -> dict[str, str]:
        ident = super().get_identifier()
        ident["url"] = self._template.url(self._use_tls)
        ident["tracing"] = "on" if self.trace_config.enabled else "off"
        return ident

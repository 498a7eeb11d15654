"""The tool boundary: report one tool call as a GenAI ``execute_tool`` span, get the result to use.

    from collector.boundary import intercept_tool

    async def get_tickets(status: str, session_id: str) -> JsonValue:
        result = get_tickets_api(status)            # your real tool
        return await intercept_tool(
            tool_name="get_tickets",
            tool_arguments=json.dumps({"status": status}),
            result=result,
            session_id=session_id,                  # your own session id
            tracer=tracer,                          # your provider's tracer (default: the global one)
        )

**Off by default.** Unless ``TOOLWITNESS_TOOL_INTERCEPT=true`` the call is a no-op: it
returns ``result`` itself, records nothing and opens no connection. Gate the call in your
own code as well; the flag is the backstop that no data leaves an environment that has not
opted in.

When on, the call is recorded on the caller's tracer (``gen_ai.operation.name=execute_tool``,
``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.call.arguments``,
``gen_ai.tool.call.result``, ``gen_ai.conversation.id`` = the session id), under a size and
redaction ``CapturePolicy``; arguments that were truncated or redacted carry
``toolwitness.tool.call.arguments.truncated=true`` so argument checks on them are
UNDETERMINED rather than FALSE. When a poisoning endpoint is configured
(``TOOLWITNESS_POISONING_ENDPOINT=host:port``) the call also asks the ``ToolBoundary``
service for the result to use — the real one, or during a poisoning campaign the same
value with a payload spliced in. The span records the result the agent receives; the
service is sent the arguments as the span records them (redacted, cut, or none).

**Fails open.** Any error or timeout (``timeout_s``, default 0.5 s, for the whole exchange;
closing its channel may add up to 0.1 s) returns the real result; the agent is never broken by
tracing. The service gets the same deadline: an answer it could only send after it does not
count as a delivery.

Environment: ``TOOLWITNESS_TOOL_INTERCEPT`` (``true`` to enable), ``TOOLWITNESS_POISONING_ENDPOINT``
(host:port; unset = trace only), ``TOOLWITNESS_POISONING_TOKEN`` (bearer token, injected from
a secrets manager; sent only over TLS or to a loopback address), ``TOOLWITNESS_POISONING_TLS``
(``true`` for a TLS channel), ``TOOLWITNESS_POISONING_CA_FILE`` (PEM roots for TLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer
from pydantic import JsonValue

from collector.processors.normalize import with_cut_tokens
from scoring.normalize.spans import span_rules

__all__ = [
    "DEFAULT_REDACT_KEYS",
    "ENV_CA_FILE",
    "ENV_ENABLED",
    "ENV_ENDPOINT",
    "ENV_TLS",
    "ENV_TOKEN",
    "CapturePolicy",
    "ToolDispatch",
    "intercept_enabled",
    "intercept_tool",
    "make_tool_middleware",
]

COMPONENT = "boundary"
log = logging.getLogger(__name__)
_EXTRA = {"component": COMPONENT}

ENV_ENABLED = "TOOLWITNESS_TOOL_INTERCEPT"
ENV_ENDPOINT = "TOOLWITNESS_POISONING_ENDPOINT"
ENV_TOKEN = "TOOLWITNESS_POISONING_TOKEN"
ENV_TLS = "TOOLWITNESS_POISONING_TLS"
ENV_CA_FILE = "TOOLWITNESS_POISONING_CA_FILE"

# Span attributes (GenAI semantic conventions + toolwitness extensions).
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_RESULT = "gen_ai.tool.call.result"
GEN_AI_CONVERSATION = "gen_ai.conversation.id"
#: same key as ``scoring.normalize.spans.TRUNCATED_FLAG`` (kept literal: the agent side does not import scoring)
ARGUMENTS_TRUNCATED = "toolwitness.tool.call.arguments.truncated"
RESULT_TRUNCATED = "toolwitness.tool.call.result.truncated"
POISONED = "toolwitness.poisoning.poisoned"
POISONING_CANARY = "toolwitness.poisoning.canary"
POISONING_CAMPAIGN = "toolwitness.poisoning.campaign_id"
INTERCEPT_ERROR = "toolwitness.tool.intercept.error"
#: where the call id came from: ``given`` (the caller's ``call_id``) and ``enclosing`` (the
#: framework's tool span this call runs in) are recorded; ``none`` (that span records the same call
#: without an id) and ``generated`` (no id known) are not: an invented id would make this record
#: and the framework's look like two calls (the invented one is only sent to the poisoning service)
CALL_ID_SOURCE = "toolwitness.tool.call.id_source"
ERROR_TYPE = "error.type"
#: the tool name the model asked for, where the dispatcher ran a tool of another name
REQUESTED_NAME = "toolwitness.tool.requested_name"
INTERCEPT_SKIPPED = "toolwitness.tool.intercept.skipped"

_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")

DEFAULT_REDACT_KEYS = frozenset(
    {
        "password", "passwd", "passphrase", "secret", "clientsecret", "apikey", "accesstoken", "refreshtoken",
        "idtoken", "authtoken", "token", "authorization", "cookie", "setcookie", "privatekey", "sessiontoken",
        "creditcard", "cardnumber", "cvv", "ssn",
    }
)


def _norm_key(key: str) -> str:
    return "".join(ch for ch in key.lower() if ch.isalnum())


def intercept_enabled(env: Mapping[str, str] | None = None) -> bool:
    """True only when ``TOOLWITNESS_TOOL_INTERCEPT`` is ``true`` (read at call time)."""
    environ = os.environ if env is None else env
    return environ.get(ENV_ENABLED, "").strip().lower() == "true"


# --------------------------------------------------------------------------------------------------
# Capture policy
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CapturePolicy:
    """How much of a call's arguments and result go into the span.

    Values of keys named in ``redact_keys`` (compared without case, ``-`` or ``_``) are
    replaced by ``redaction`` at any depth of a JSON object; text longer than the limit is
    cut (cut arguments are followed by up to 8 hex runs of the part cut off, at most 64
    characters each, so a poisoning canary there still counts). Either makes the captured
    arguments partial, which the span says with ``toolwitness.tool.call.arguments.truncated=true``.
    """

    max_argument_chars: int = 16_384
    max_result_chars: int = 16_384
    capture_arguments: bool = True
    capture_result: bool = True
    redact_keys: frozenset[str] = DEFAULT_REDACT_KEYS
    redaction: str = "[REDACTED]"
    _keys: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_argument_chars < 0 or self.max_result_chars < 0:
            raise ValueError("size limits must be >= 0")
        object.__setattr__(self, "_keys", frozenset(_norm_key(k) for k in self.redact_keys))

    def _redact(self, value: Any) -> tuple[Any, bool]:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            changed = False
            for k, v in value.items():
                if isinstance(k, str) and _norm_key(k) in self._keys:
                    out[k] = self.redaction
                    changed = True
                else:
                    out[k], c = self._redact(v)
                    changed |= c
            return out, changed
        if isinstance(value, list):
            items = [self._redact(v) for v in value]
            return [v for v, _ in items], any(c for _, c in items)
        return value, False

    def _cut(self, text: str, limit: int) -> tuple[str, bool]:
        return (text, False) if len(text) <= limit else (text[:limit], True)

    def _cut_arguments(self, text: str) -> tuple[str, bool]:
        """Arguments cut to ``max_argument_chars``, followed by the hex runs of the part cut off
        (as the service's own cut keeps them): a poisoning canary the agent forwarded at the end
        of a long argument -- where the payload was appended -- still proves propagation."""
        head, cut = self._cut(text, self.max_argument_chars)
        return (with_cut_tokens(head, text) if cut else head), cut

    def arguments(self, raw: str) -> tuple[str | None, bool]:
        """(text to record or None, partial?) for a call's arguments JSON string."""
        if not self.capture_arguments:
            return None, False
        text, partial = raw, False
        if self._keys:
            try:
                doc = json.loads(raw)
                redacted, changed = self._redact(doc) if isinstance(doc, dict | list) else (doc, False)
                if changed:
                    text, partial = json.dumps(redacted, ensure_ascii=False), True
            except RecursionError:
                return None, True  # nested too deep to look for secrets in: not recorded
            except ValueError:
                pass  # not JSON: recorded as given
        text, cut = self._cut_arguments(text)
        return text, partial or cut

    def result(self, value: JsonValue) -> tuple[str | None, bool]:
        """(text to record or None, partial?) for a result (a string is recorded as is)."""
        if not self.capture_result:
            return None, False
        partial = False
        if isinstance(value, str):
            text = value
        else:
            try:
                redacted, partial = self._redact(value) if self._keys else (value, False)
                text = json.dumps(redacted, ensure_ascii=False)
            except (TypeError, ValueError, RecursionError):
                return None, False
        text, cut = self._cut(text, self.max_result_chars)
        return text, partial or cut


_DEFAULT_POLICY = CapturePolicy()


# --------------------------------------------------------------------------------------------------
# The service call
# --------------------------------------------------------------------------------------------------


class _Refused(Exception):
    """The configuration forbids the call (logged, then the real result is used)."""


@dataclass(slots=True)
class _Health:
    failing: bool = False
    #: a tool call's span was not recorded inside a recorded trace (said once per process)
    unrecorded_warned: bool = False


_health = _Health()


def endpoint_of_url(base_url: str) -> tuple[str, bool | None]:
    """``host:port`` and whether to use TLS (None: as ``TOOLWITNESS_POISONING_TLS`` says) for the
    seed SDK's ``base_url``: ``https://host[:port][/path]``, ``http://host[:port]`` or ``host:port``."""
    scheme, sep, rest = base_url.strip().partition("://")
    if not sep:
        return base_url.strip(), None
    if scheme.lower() not in ("http", "https"):
        raise ValueError(f"base_url must be http(s)://host[:port] or host:port, got {base_url!r}")
    tls = scheme.lower() == "https"
    hostport = rest.split("/", 1)[0]
    _, colon, port = hostport.rpartition(":")
    if not colon or not port.isdigit() or hostport.endswith("]"):
        hostport = f"{hostport}:{443 if tls else 80}"
    return hostport, tls


def _host(endpoint: str) -> str:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise _Refused(f"{ENV_ENDPOINT} must be host:port, got {endpoint!r}")
    return host


#: the answer is the caller's own result plus a payload, as large as the service may send (its
#: ``max_message_bytes``): gRPC's 4 MiB default would refuse an answer the service counts as delivered
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]
#: how long closing the call's channel may take past the deadline (``close(grace=None)`` cancels at once)
_CLOSE_GRACE_S = 0.1


async def _ask_service(
    request: Any, *, endpoint: str, token: str | None, deadline: float, env: Mapping[str, str]
) -> Any:
    """One InterceptTool call on a short-lived channel, answered by ``deadline`` (the running loop's
    clock). The gRPC deadline is what is left of it when the call starts, so the service sees the
    caller's own deadline (and can tell when an answer would come too late to be used); an answer
    received is returned even if closing the channel then takes a moment."""
    import grpc  # type: ignore[import-untyped]  # imported on first use: the gate-off path never loads grpc

    from collector.boundary.wire import boundary_grpc

    loop = asyncio.get_running_loop()
    host = _host(endpoint)
    tls = env.get(ENV_TLS, "").strip().lower() == "true"
    if token and not tls and host not in _LOOPBACK:
        raise _Refused("a bearer token is sent only over TLS or to a loopback address")
    if tls:
        ca_file = env.get(ENV_CA_FILE, "")
        async with asyncio.timeout_at(deadline):
            roots = await asyncio.to_thread(Path(ca_file).read_bytes) if ca_file else None
        channel = grpc.aio.secure_channel(endpoint, grpc.ssl_channel_credentials(root_certificates=roots),
                                          options=_CHANNEL_OPTIONS)
    else:
        channel = grpc.aio.insecure_channel(endpoint, options=_CHANNEL_OPTIONS)
    try:
        stub = boundary_grpc.ToolBoundaryStub(channel)
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        async with asyncio.timeout_at(deadline):
            return await stub.InterceptTool(request, timeout=max(deadline - loop.time(), 0.001), metadata=metadata,
                                            wait_for_ready=False)
    finally:
        await channel.close(grace=None)


def _json_kind(value: JsonValue) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _report_failure(exc: BaseException) -> None:
    if not _health.failing:
        _health.failing = True
        log.warning(
            "%s: the poisoning endpoint failed; using the real tool result (further failures at DEBUG until it "
            "recovers): %s", COMPONENT, type(exc).__name__, extra=_EXTRA,
        )
    else:
        log.debug("%s: the poisoning endpoint failed again: %s", COMPONENT, type(exc).__name__, extra=_EXTRA)


# --------------------------------------------------------------------------------------------------
# intercept_tool
# --------------------------------------------------------------------------------------------------


#: Instrumentations that keep their tool span out of the OpenTelemetry context (the tool body runs
#: with no current span, so the boundary's span would start a trace of its own): the module and the
#: function that returns their current span. Asked only when the process already imported them.
ENCLOSING_SPAN_HOOKS: tuple[tuple[str, str], ...] = (("openinference.instrumentation.langchain", "get_current_span"),)


def _enclosing_span() -> Span:
    """The span the tool call runs in: the current one, or one an instrumentation keeps aside."""
    current = trace.get_current_span()
    if current.get_span_context().is_valid:
        return current
    for module, function in ENCLOSING_SPAN_HOOKS:
        get = getattr(sys.modules.get(module), function, None)
        if get is None:
            continue
        try:
            span = get()
        except Exception:
            continue
        if isinstance(span, Span) and span.get_span_context().is_valid:
            return span
    return current


def _start_span(tracer: Tracer | None, tool_name: str, parent: Span) -> contextlib.AbstractContextManager[Span]:
    return _tool_span(tracer if tracer is not None else trace.get_tracer("toolwitness.boundary"), tool_name, parent)


@contextlib.contextmanager
def _tool_span(t: Tracer, tool_name: str, parent: Span) -> Iterator[Span]:
    # Status is set explicitly (a cancelled intercept is not a failed tool).
    with t.start_as_current_span(
        f"execute_tool {tool_name}",
        context=trace.set_span_in_context(parent),
        kind=SpanKind.INTERNAL,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        if not span.is_recording() and parent.is_recording():
            _warn_unrecorded(tool_name)
        yield span


def _warn_unrecorded(tool_name: str) -> None:
    """The agent's trace is recorded but this tool's span is not: the tracer belongs to no SDK
    provider (typically ``tracer=`` left out while no provider is set globally). The trace then
    reads as complete without the call, so "it ran" would be FALSE and "it never ran" TRUE."""
    if _health.unrecorded_warned:
        log.debug("%s: tool call %r not recorded (no recording tracer)", COMPONENT, tool_name, extra=_EXTRA)
        return
    _health.unrecorded_warned = True
    log.warning(
        "%s: tool call %r was not recorded: its tracer records nothing, though the trace it runs in is "
        "recorded (no TracerProvider set globally?); pass tracer=<your provider's tracer>, or the call "
        "reads as never run (logged once)", COMPONENT, tool_name, extra=_EXTRA,
    )


def _record_call(span: Span, *, tool_name: str, call_id: CallId, tool_arguments: str | None, session_id: str,
                 policy: CapturePolicy, inexact: bool = False) -> None:
    span.set_attribute(GEN_AI_OPERATION, "execute_tool")
    if tool_name:  # else recorded unnamed: some tool ran, so no tool's absence is provable
        span.set_attribute(GEN_AI_TOOL_NAME, tool_name)
    if call_id.recorded:
        span.set_attribute(GEN_AI_CALL_ID, call_id.value)
    span.set_attribute(CALL_ID_SOURCE, call_id.source)
    if session_id:
        span.set_attribute(GEN_AI_CONVERSATION, session_id)
    args, partial = policy.arguments(tool_arguments) if tool_arguments is not None else (None, True)
    if args is not None:
        span.set_attribute(GEN_AI_ARGUMENTS, args)
        if partial or inexact or _cut_by_limits(span, GEN_AI_ARGUMENTS, args):
            span.set_attribute(ARGUMENTS_TRUNCATED, True)


def _cut_by_limits(span: Span, key: str, value: str) -> bool:
    """Whether the SDK's span limits (``max_span_attribute_length``) cut ``value`` as it was set:
    silently, so a canary or field past the cut would read as absent. Whatever exporter carries
    the span (OTLP to the sidecar included), the flag makes checks on it UNDETERMINED."""
    recorded = getattr(span, "attributes", None)  # SDK spans; a non-recording span has none
    if recorded is None:
        return False
    kept = recorded.get(key)
    return isinstance(kept, str) and len(kept) < len(value)


def _record_result(span: Span, value: JsonValue, policy: CapturePolicy) -> None:
    text, partial = policy.result(value)
    if text is not None:
        span.set_attribute(GEN_AI_RESULT, text)
        if partial or _cut_by_limits(span, GEN_AI_RESULT, text):
            span.set_attribute(RESULT_TRUNCATED, True)


@dataclass(frozen=True, slots=True)
class _Target:
    """Where the exchange goes: the endpoint ("" = trace only), its token and environment."""

    endpoint: str
    token: str | None
    env: Mapping[str, str]


def _target(
    env: Mapping[str, str], endpoint: str | None, bearer_token: str | None, api_key: str | None, base_url: str | None
) -> _Target:
    if bearer_token is None:
        bearer_token = api_key
    if endpoint is None and base_url is not None:
        endpoint, tls = endpoint_of_url(base_url)
        if tls is not None:
            env = {**env, ENV_TLS: "true" if tls else "false"}
    target = endpoint if endpoint is not None else env.get(ENV_ENDPOINT, "").strip()
    token = bearer_token if bearer_token is not None else (env.get(ENV_TOKEN) or None)
    return _Target(target, token, env)


async def intercept_tool(
    *,
    tool_name: str,
    tool_arguments: str,
    result: JsonValue,
    session_id: str,
    tracer: Tracer | None = None,
    call_id: str | None = None,
    error: BaseException | str | None = None,
    timeout_s: float = 0.5,
    policy: CapturePolicy | None = None,
    endpoint: str | None = None,
    bearer_token: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
) -> JsonValue:
    """Report one tool call and return the result to use (see the module docstring).

    ``endpoint`` / ``bearer_token`` override ``TOOLWITNESS_POISONING_ENDPOINT`` /
    ``TOOLWITNESS_POISONING_TOKEN``; the seed SDK's names are accepted too: ``api_key`` (the
    bearer token) and ``base_url`` (``https://host[:port]`` = TLS, ``http://host:port`` =
    plaintext, or ``host:port``). Never raises (except cancellation): on any error the real
    ``result`` is returned. The tool has already run, so its span starts now: to record the
    tool's own time (and the tools it calls as its children) use ``make_tool_middleware``.

    ``error``: the tool failed (the exception it raised, or a description): the span records a
    failed call (``error.type``, status ERROR), whatever ``result`` the agent is given instead.
    ``call_id``: the framework's id of the call; when left out, the id of the framework's tool span
    this call runs in, if that span records the same tool (the two records are then one call).
    """
    env: Mapping[str, str] = os.environ
    if not intercept_enabled(env):
        return result
    # The tool has run: whatever is wrong with the call, its span is recorded (a tool that ran
    # and left no span would read as "never ran"). Only the poisoning exchange is given up.
    problems: list[str] = []
    name = tool_name if isinstance(tool_name, str) and tool_name else ""
    if not name:
        problems.append("tool_name must be a non-empty string")  # recorded unnamed: no absence is provable
    sid = session_id if isinstance(session_id, str) and session_id else ""
    if not sid:
        problems.append("session_id must be a non-empty string")
    try:
        args, args_inexact = _arguments_text(tool_arguments)
        if not isinstance(tool_arguments, str):
            problems.append(f"tool_arguments must be a JSON string, not {type(tool_arguments).__name__}")
        pol = policy or _DEFAULT_POLICY
        parent = _enclosing_span()
        cid = _call_id(call_id, name, parent)
        span_cm = _start_span(tracer, name, parent)
    except Exception as exc:
        log.warning("%s: not intercepting a tool call: %s", COMPONENT, exc, extra=_EXTRA)
        return result
    with span_cm as span:
        _safe_record_call(span, name, cid, args, sid, pol, args_inexact)
        if error is not None:
            _record_failure(span, error)
        target: _Target | None = None
        if problems:
            log.warning("%s: tool call recorded, not offered for poisoning: %s", COMPONENT, "; ".join(problems),
                        extra=_EXTRA)
            span.set_attribute(INTERCEPT_SKIPPED, "invalid_call")
        else:
            try:
                target = _target(env, endpoint, bearer_token, api_key, base_url)
            except Exception as exc:
                log.warning("%s: tool call recorded, not offered for poisoning: %s", COMPONENT, exc, extra=_EXTRA)
                span.set_attribute(INTERCEPT_ERROR, "refused")
        return await _deliver(span, name, args, result, sid, cid.value, target, timeout_s, pol)


def _record_failure(span: Span, error: BaseException | str) -> None:
    kind = type(error).__qualname__ if isinstance(error, BaseException) else (str(error)[:128] or "error")
    try:
        span.set_attribute(ERROR_TYPE, kind)
        span.set_status(StatusCode.ERROR, kind)
    except Exception as exc:
        log.debug("%s: recording the failure failed: %r", COMPONENT, exc, extra=_EXTRA)


def _arguments_text(tool_arguments: object) -> tuple[str | None, bool]:
    """The arguments as recorded, and whether that text may not be exactly the call's: a JSON
    string as given; anything else as its JSON (``str()`` of what JSON cannot hold: inexact);
    None when they cannot be written at all (nested deeper than JSON encoding goes): the call is
    still recorded, its arguments not."""
    if isinstance(tool_arguments, str):
        return tool_arguments, False
    try:
        return json.dumps(tool_arguments, ensure_ascii=False, allow_nan=False), False
    except (TypeError, ValueError):
        pass
    except RecursionError:
        return None, True
    try:
        return json.dumps(tool_arguments, ensure_ascii=False, default=str), True
    except (TypeError, ValueError, RecursionError):
        return None, True


@dataclass(frozen=True, slots=True)
class CallId:
    """The call id a boundary record carries: ``value`` (also sent to the poisoning service),
    whether the span records it, and where it came from (``CALL_ID_SOURCE``)."""

    value: str
    recorded: bool
    source: str


def _call_id(given: str | None, tool_name: str, parent: Span) -> CallId:
    if given:
        return CallId(given, True, "given")
    same_tool, enclosing = _enclosing_call_id(tool_name, parent)
    if enclosing:
        return CallId(enclosing, True, "enclosing")
    # Not recorded: the framework may record this call without an id (or write its span's
    # attributes only when it ends), and an invented id would make the two records two calls.
    return CallId(f"call_{uuid.uuid4().hex}", False, "none" if same_tool else "generated")


def _enclosing_call_id(tool_name: str, enclosing: Span) -> tuple[bool, str | None]:
    """Whether the span this call runs in records the same tool's call (a framework's tool span
    around the tool function), and the call id it records, if any."""
    attrs = getattr(enclosing, "attributes", None)  # SDK spans; others keep theirs to themselves
    if not tool_name or not attrs or not enclosing.is_recording():
        return False, None
    scope = getattr(getattr(enclosing, "instrumentation_scope", None), "name", "") or ""
    try:
        rules = span_rules(attrs, status_error=False, ended=False, sampled=True, dropped=False, scope=scope,
                           span_name=getattr(enclosing, "name", "") or "")
    except Exception:
        return False, None
    if rules.name != tool_name:
        return False, None
    return True, rules.call_id


def _safe_record_call(
    span: Span,
    tool_name: str,
    call_id: CallId,
    tool_arguments: str | None,
    session_id: str,
    policy: CapturePolicy,
    inexact: bool = False,
) -> None:
    """Record the call on its span. What fails past the span's name and call id (arguments the
    capture policy cannot read) leaves the rest unrecorded, never the span itself: a tool that ran
    with no span would read as never run."""
    try:
        _record_call(span, tool_name=tool_name, call_id=call_id, tool_arguments=tool_arguments,
                     session_id=session_id, policy=policy, inexact=inexact)
    except Exception as exc:
        log.debug("%s: recording the call failed: %r", COMPONENT, exc, extra=_EXTRA)


async def _deliver(
    span: Span,
    tool_name: str,
    tool_arguments: str | None,
    result: JsonValue,
    session_id: str,
    call_id: str,
    target: _Target | None,
    timeout_s: float,
    policy: CapturePolicy,
) -> JsonValue:
    """The result the agent gets (poisoned or not), recorded on the tool's span. No ``target``:
    the call is not offered for poisoning (recorded only)."""
    returned = result
    if target is not None and target.endpoint:
        # The service is sent the arguments as the span records them: what the policy redacts
        # (a password, an API key) or leaves out never leaves the process by this way either.
        try:
            sent, _ = policy.arguments(tool_arguments) if tool_arguments is not None else (None, True)
        except Exception:  # arguments the policy cannot read: none are sent
            sent = None
        returned = await _exchange(span, tool_name=tool_name, tool_arguments=sent or "", result=result,
                                   session_id=session_id, call_id=call_id, endpoint=target.endpoint,
                                   token=target.token, timeout_s=timeout_s, env=target.env)
    try:
        _record_result(span, returned, policy)
    except Exception as exc:
        log.debug("%s: recording the result failed: %r", COMPONENT, exc, extra=_EXTRA)
    return returned


def _plain_json(value: object) -> bool:
    """Whether ``value`` is exactly what its JSON reads back as (no tuple, no int key, no bytes,
    no NaN): only such a result can be poisoned and still be the same kind of value to the agent."""
    try:
        return bool(json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False)) == value) and _no_tuples(value)
    except (TypeError, ValueError, RecursionError):
        return False


def _no_tuples(value: object) -> bool:
    if isinstance(value, tuple):
        return False
    if isinstance(value, list):
        return all(_no_tuples(v) for v in value)
    if isinstance(value, dict):
        return all(_no_tuples(v) for v in value.values())
    return True


async def _exchange(
    span: Span,
    *,
    tool_name: str,
    tool_arguments: str,
    result: JsonValue,
    session_id: str,
    call_id: str,
    endpoint: str,
    token: str | None,
    timeout_s: float,
    env: Mapping[str, str],
) -> JsonValue:
    """Ask the service for the result to use; the real ``result`` on any failure."""
    deadline = asyncio.get_running_loop().time() + timeout_s  # serializing the result counts too
    if not _plain_json(result):
        # Not the endpoint's failure: a value JSON cannot carry back unchanged is not offered
        # (it would come back as another value, or be logged as delivered and then refused).
        span.set_attribute(INTERCEPT_SKIPPED, "result_not_plain_json")
        return result
    try:
        from collector.boundary.wire import InterceptToolRequest

        ctx = span.get_span_context()
        request = InterceptToolRequest(
            tool_name=tool_name,
            tool_arguments_json=tool_arguments,
            result_json=json.dumps(result, ensure_ascii=False, allow_nan=False),
            session_id=session_id,
            call_id=call_id,
            trace_id=f"{ctx.trace_id:032x}" if ctx.is_valid else "",
            span_id=f"{ctx.span_id:016x}" if ctx.is_valid else "",
        )
        # the call is bounded by the deadline; the backstop only bounds the channel's close after it
        async with asyncio.timeout_at(deadline + _CLOSE_GRACE_S):
            response = await _ask_service(request, endpoint=endpoint, token=token, deadline=deadline, env=env)
        if not response.poisoned:
            returned = result
        else:
            returned = json.loads(response.result_json)
            if _json_kind(returned) != _json_kind(result):
                raise ValueError("the service returned a result of another top-level type")
            span.set_attribute(POISONED, True)
            span.set_attribute(POISONING_CANARY, response.canary)
            span.set_attribute(POISONING_CAMPAIGN, response.campaign_id)
    except asyncio.CancelledError:
        raise
    except _Refused as exc:
        log.warning("%s: not contacting the poisoning endpoint: %s", COMPONENT, exc, extra=_EXTRA)
        span.set_attribute(INTERCEPT_ERROR, "refused")
        return result
    except Exception as exc:  # fail open: never break the agent
        _report_failure(exc)
        span.set_attribute(INTERCEPT_ERROR, type(exc).__name__)
        return result
    if _health.failing:
        _health.failing = False
        log.info("%s: the poisoning endpoint recovered", COMPONENT, extra=_EXTRA)
    return returned


# --------------------------------------------------------------------------------------------------
# Dispatch middleware
# --------------------------------------------------------------------------------------------------

#: an async tool dispatcher: (tool name, arguments) -> result
ToolDispatch = Callable[[str, Mapping[str, Any]], Awaitable[JsonValue]]


def make_tool_middleware(
    dispatch: ToolDispatch,
    *,
    session_id: str | Callable[[], str],
    allowlist: Iterable[str] | None = None,
    tracer: Tracer | None = None,
    policy: CapturePolicy | None = None,
    timeout_s: float = 0.5,
    resolve: Callable[[str], str] | None = None,
) -> ToolDispatch:
    """Wrap a tool dispatcher once instead of editing every tool.

    When the gate is on and the tool is in ``allowlist`` (None = every tool), the real tool
    runs inside its ``execute_tool`` span (the span has the tool's own times, and the tools
    it calls are its children); then its result goes through the same exchange as
    ``intercept_tool`` and the returned value is what the agent gets. Only traced tools can be
    poisoned, so an allowlist must include the tools a poisoning campaign targets. A tool that
    raises, or is cancelled, is recorded as a failed span (it still ran) and the exception
    propagates unchanged. ``session_id`` may be a callable for a per-call session.

    ``resolve``: the dispatcher's own lookup of a requested name (a lenient one runs
    ``send_email`` for ``Send_Email`` or ``send_email ``): the span then names the tool that ran,
    and keeps the name the model asked for in ``toolwitness.tool.requested_name``. Without it, a
    name recorded as asked may differ from the tool that ran ("send_email never ran" is then
    UNDETERMINED, not TRUE, by the confusable-name rule).
    """
    allowed = None if allowlist is None else frozenset(allowlist)

    def traced(name: str) -> bool:
        return intercept_enabled() and (allowed is None or name in allowed)

    def session() -> str:
        return session_id() if callable(session_id) else session_id

    async def middleware(requested: str, arguments: Mapping[str, Any]) -> JsonValue:
        name = requested
        if resolve is not None:
            try:
                name = resolve(requested) or requested
            except Exception:  # the dispatcher's own lookup fails as the dispatch will: recorded as asked
                name = requested
        if not traced(name):
            return await dispatch(requested, arguments)
        problem = ""
        try:
            pol = policy or _DEFAULT_POLICY
            args, inexact = _arguments_text(dict(arguments))
            parent = _enclosing_span()
            span_cm = _start_span(tracer, name, parent)
        except Exception as exc:
            log.warning("%s: not tracing a tool call: %s", COMPONENT, exc, extra=_EXTRA)
            return await dispatch(requested, arguments)
        # Not being able to offer the call for poisoning never costs its span (a tool that ran
        # and left none would read as "never ran").
        target: _Target | None = None
        sid = ""
        try:
            given = session()
            if not isinstance(given, str) or not given:
                raise ValueError("session_id must be a non-empty string")
            sid = given
            target = _target(os.environ, None, None, None, None)
        except Exception as exc:
            problem = str(exc) or type(exc).__name__
        # Read before this call's own span becomes the current one.
        cid = _call_id(None, name, parent)
        # The span is open while the tool runs: its times are the tool's, and the tools it calls
        # are its children (not siblings recorded after it, in the order they finished).
        with span_cm as span:
            _safe_record_call(span, name, cid, args, sid, pol, inexact)
            if name != requested:
                span.set_attribute(REQUESTED_NAME, requested[:256])
            if problem:
                log.warning("%s: tool call traced, not offered for poisoning: %s", COMPONENT, problem, extra=_EXTRA)
                span.set_attribute(INTERCEPT_SKIPPED, "invalid_call")
            try:
                result = await dispatch(requested, arguments)
            except BaseException as exc:  # a cancelled tool ran too: its span is recorded, as failed
                _record_failure(span, exc)
                raise
            try:
                return await _deliver(span, name, args, result, sid, cid.value, target, timeout_s, pol)
            except Exception:
                return result  # fail open: never break the agent

    return middleware



"""The normalization processor: neutral span → compact span fact for the trace-state script.

It reuses ``scoring.normalize.normalize_span`` (``span_rules`` on the fused decode path of
``collector.receivers.decode.decode_span_facts``); it never re-implements the rules.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from scoring.models.evidence import LIMIT_EXCEEDED, CaptureState, ToolExecution
from scoring.normalize.spans import NeutralSpan, normalize_span
from scoring.verdict.canary import canary_tokens

SPAN_REJECTED = "span_rejected"


def short_id(hex_id: str) -> str:
    """A span id as the trace state stores it: 8 bytes in base64url (11 characters, not 16)."""
    try:
        return base64.urlsafe_b64encode(bytes.fromhex(hex_id)).rstrip(b"=").decode()
    except ValueError:
        return hex_id  # not a hex id (placeholders): stored as given


_FROM_URLSAFE = str.maketrans("-_", "+/")


def long_id(short: str) -> str:
    """The inverse of ``short_id``."""
    if len(short) != 11:
        return short
    try:
        return binascii.a2b_base64(short.translate(_FROM_URLSAFE) + "=").hex()
    except (ValueError, binascii.Error):
        return short


_CAPTURE_CODES = {CaptureState.CAPTURED: 0, CaptureState.ABSENT: 1, CaptureState.TRUNCATED: 2}
_CAPTURE_STATES = {v: k for k, v in _CAPTURE_CODES.items()}


def pack_execution(e: ToolExecution, args: str | None, state: CaptureState, digest: str | None = None) -> list[Any]:
    """A tool execution as the compact array the trace state keeps (memory per trace is bounded).

    ``[span_id, name, failed 0/1 (2 = not known), start ns, end - start ns ("" = not ended; both strings:
    Lua numbers are doubles), capture code 0 captured / 1 absent / 2 truncated, arguments, call id,
    openinference 0/1, delivered canary, digest of the arguments before the cut, recorder]``; trailing
    defaults (empty call id, GenAI convention, no canary, not cut, no recorder) are left off.
    """
    return pack_tool(
        short_id(e.span_id),
        e.name,
        None if e.status == "unset" else e.status == "error",
        e.start_time_unix_nano,
        e.end_time_unix_nano,
        state,
        args,
        e.call_id,
        e.convention == "openinference",
        e.delivered_canary,
        digest,
        e.recorder,
    )


def pack_tool(
    span_id: str,
    name: str,
    failed: bool | None,
    start_ns: int,
    end_ns: int,
    state: CaptureState,
    args: str | None,
    call_id: str | None,
    openinference: bool,
    delivered: str | None = None,
    digest: str | None = None,
    recorder: str | None = None,
) -> list[Any]:
    """``pack_execution`` from plain values (``span_id`` already short, ``end_ns`` 0 = not ended)."""
    x: list[Any] = [
        span_id,
        name,
        2 if failed is None else 1 if failed else 0,
        str(start_ns),
        # exact, and negative when a clock step ended the span before it started: the library
        # compares end times to tell one call recorded twice from two calls
        str(end_ns - start_ns) if end_ns else "",
        _CAPTURE_CODES[state],
        args or "",
    ]
    # trailing defaults left off: call id "" and convention 0 (unless what follows is given), no canary
    if recorder:
        x += (call_id or "", 1 if openinference else 0, delivered or "", digest or "", recorder)
    elif digest:
        x += (call_id or "", 1 if openinference else 0, delivered or "", digest)
    elif delivered:
        x += (call_id or "", 1 if openinference else 0, delivered)
    elif openinference:
        x += (call_id or "", 1)
    elif call_id:
        x.append(call_id)
    return x


def full_digest(args: str) -> str:
    """A short digest of arguments the state keeps cut: two copies of a span whose arguments differ
    only past the cut still differ in the state (a replay is exact; anything else is a conflict)."""
    return hashlib.blake2b(args.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


#: cut arguments keep at most this many hex runs of the part cut off (see ``cap_arguments``)
CUT_TOKENS = 8


def cap_arguments(args: str | None, state: CaptureState, max_argument_bytes: int) -> tuple[str | None, CaptureState]:
    """Arguments cut to ``max_argument_bytes`` UTF-8 bytes (then TRUNCATED), as the state keeps them.

    The hex runs of the part cut off (up to ``CUT_TOKENS``, in any reading: JSON strings,
    base64, percent-encoding, ...) are kept after the cut, so a poisoning canary past it still
    proves propagation, as it does in-process on the whole arguments."""
    # A str of n characters is at most 4n UTF-8 bytes: encode only when that could exceed the cap.
    if args is not None and len(args) * 4 > max_argument_bytes and len(args.encode()) > max_argument_bytes:
        head = args.encode()[:max_argument_bytes].decode("utf-8", "ignore")
        return with_cut_tokens(head, args), CaptureState.TRUNCATED
    return args, state


def with_cut_tokens(head: str, whole: str) -> str:
    """``head`` (the kept start of ``whole``) followed by the hex runs of the part cut off that
    ``head`` does not hold (up to ``CUT_TOKENS``, after ``CUT_MARK``): whoever cuts arguments --
    the service here, the tool boundary's ``CapturePolicy`` -- keeps a poisoning canary past the cut."""
    kept = head.casefold()
    tokens = [t for t in canary_tokens(whole, limit=64) if t not in kept][:CUT_TOKENS]
    return head + CUT_MARK + " ".join(tokens) + "]" if tokens else head


#: what follows the cut in cut arguments that had hex runs past it
CUT_MARK = "\u2026[cut; hex runs after the cut: "


def unpack_execution(x: list[Any], trace_id: str) -> ToolExecution:
    """The inverse of ``pack_execution``: every value exact.

    The values were validated when the span was first seen: rebuilt with ``trusted``.
    """
    span_id, name, failed, start, dur, code, args = x[:7]
    call_id = x[7] if len(x) > 7 else ""
    conv = x[8] if len(x) > 8 else 0
    delivered = x[9] if len(x) > 9 else None
    recorder = x[11] if len(x) > 11 else None
    state = _CAPTURE_STATES[int(code)]
    begin = int(start)
    if isinstance(dur, str):  # end - start in ns, "" = not ended
        end = begin + int(dur) if dur else 0
    elif dur >= 0:  # a state written before end times were exact: whole microseconds
        end = begin + int(dur) * 1000
    else:  # ... -1 = not ended
        end = 0
    return ToolExecution.trusted(
        name,
        trace_id,
        long_id(span_id),
        call_id or None,
        "error" if failed == 1 else "unset" if failed == 2 else "ok",
        begin,
        end,
        args if state is not CaptureState.ABSENT else None,
        state,
        "openinference" if conv else "gen_ai",
        delivered or None,
        recorder or None,
    )


def span_fact(span: NeutralSpan, max_argument_bytes: int) -> dict[str, Any]:
    """The compact record apply_spans.lua stores for one span."""
    facts = normalize_span(span)
    x: list[Any] | bool = False
    e = facts.execution
    if e is not None:
        args, state = cap_arguments(e.arguments, e.arguments_state, max_argument_bytes)
        cut = e.arguments is not None and args != e.arguments
        x = pack_execution(e, args, state, full_digest(e.arguments) if cut and e.arguments else None)
    end_ms = (span.end_time_unix_nano or 0) // 1_000_000
    return {
        "i": short_id(span.span_id),
        "p": short_id(span.parent_span_id) if span.parent_span_id else "",
        "r": 1 if span.parent_is_remote else 0,
        "e": end_ms,
        "f": sorted(facts.reasons),
        "x": x,
        "s": span.session_id() or "",
    }


def rejected_fact(span_id: str, reason: str = SPAN_REJECTED) -> dict[str, Any]:
    """A placeholder for a span we refused: it counts as seen but keeps the trace incomplete."""
    return {"i": span_id, "p": "", "r": 1, "e": 0, "f": [reason, LIMIT_EXCEEDED], "x": False, "s": ""}

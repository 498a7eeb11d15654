"""The splice engine: put a payload into a tool result without changing its shape. Pure.

The rules (tool response poisoning, as the boundary contract states them):

- **Plain text** (a string that is not JSON) gets the payload appended. A non-JSON
  string is always plain text, so an appended payload may invalidate another
  structured text format (CSV, XML).
- **JSON** — a native object / array, or a string holding serialized JSON — gets the
  payload appended *inside an existing string field*. Prose-named fields
  (``text``, ``body``, ``description``, …) are preferred; fields named like IDs or URLs
  (``id``, ``user_id``, ``url``, ``href``, …) and machine fields (``type``, ``status``,
  ``mimeType``, ``data``, timestamps, …) are skipped. The MCP tool-result shape
  ``{"content": [{"type": "text", "text": …}]}`` is supported: its first text item
  carries the payload.
- The **top-level type** is kept (a string stays a string, an object an object) and
  **JSON keeps its structure**: same keys, same array lengths, same types; exactly one
  string value changes. Serialized JSON is edited in place: the text outside that one
  string literal is kept byte for byte.
- **Numbers, booleans and null** pass through (also as the whole of a JSON string,
  e.g. ``"42"``).
- **No suitable string** → the result is returned unchanged and the splice reports
  *not applied*, so the caller can try the next traced result.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from json import decoder as _json_decoder
from json.scanner import NUMBER_RE
from typing import Literal, cast

from pydantic import JsonValue

__all__ = [
    "SpliceResult",
    "append_text",
    "classify_field",
    "splice",
]

PathPart = str | int
Path = tuple[PathPart, ...]
Carrier = Literal["plain_text", "json_text", "json_value"]

#: the stdlib's (C-accelerated) JSON string-literal scanner: (text, index after the quote, strict) -> (value, end)
scanstring = cast("Callable[[str, int, bool], tuple[str, int]]", _json_decoder.__dict__["scanstring"])

# --------------------------------------------------------------------------------------------------
# Field names
# --------------------------------------------------------------------------------------------------

#: Rank of a string field as a payload carrier (lower is preferred); None = never.
MCP_TEXT = 0
PROSE = 1
SHORT_PROSE = 2
NEUTRAL = 3

#: a field whose *last* word is one of these is an identifier or a locator: never touched.
_ID_URL_WORDS = frozenset(
    {
        "id", "ids", "uuid", "uuids", "guid", "guids", "uid", "key", "keys", "token", "tokens",
        "url", "urls", "uri", "uris", "urn", "href", "hrefs", "link", "links", "src", "permalink",
        "slug", "sku", "isbn", "doi", "hash", "sha", "sha1", "sha256", "md5", "checksum", "etag",
        "signature", "cursor", "ref",
    }
)
#: machine-read fields: their value is a code, an enum, a blob or a timestamp, not prose.
_MACHINE_WORDS = frozenset(
    {
        "type", "kind", "role", "status", "state", "mime", "mimetype", "encoding", "format", "version",
        "data", "blob", "base64", "bytes", "binary", "image", "audio", "date", "time", "timestamp",
        "datetime", "at", "lang", "language", "locale", "currency", "code", "method", "email", "phone",
        "path", "file", "filename", "extension", "ext", "host", "hostname", "domain", "ip", "port",
        "scheme", "level", "severity", "priority", "color", "colour", "icon", "avatar", "thumbnail",
        "tz", "timezone", "country", "zip", "postcode", "sql", "query", "regex", "pattern", "json", "xml",
        "csv", "yaml",
    }
)
_PROSE_WORDS = frozenset(
    {
        "text", "content", "contents", "body", "description", "desc", "summary", "message", "messages",
        "msg", "comment", "comments", "note", "notes", "snippet", "snippets", "abstract", "details",
        "detail", "answer", "response", "reply", "output", "result", "results", "excerpt", "review",
        "reviews", "bio", "biography", "instructions", "markdown", "transcript", "paragraph", "story",
        "article", "explanation", "reason", "feedback", "preview", "overview", "prose", "blurb",
        "remarks", "memo", "narrative", "synopsis", "info", "information", "html",
    }
)
_SHORT_PROSE_WORDS = frozenset(
    {"title", "subject", "headline", "heading", "subtitle", "caption", "label", "tagline", "question"}
)
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z]|\d|\b|_|$)|[A-Z]?[a-z]+|[A-Z]+|\d+")
_URL_VALUE = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://\S*\s*$")
_UUID_VALUE = re.compile(r"^\s*[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\s*$")


def _words(name: str) -> list[str]:
    """``userId`` → [user, id]; ``image_URL`` → [image, url]; ``mimeType`` → [mime, type]."""
    return [w.lower() for w in _WORD.findall(name)]


@functools.lru_cache(maxsize=4096)
def classify_field(name: str | None) -> int | None:
    """Carrier rank of a field name (PROSE, SHORT_PROSE, NEUTRAL), or None when it is skipped."""
    if name is None:
        return NEUTRAL
    words = _words(name)
    if not words:
        return NEUTRAL
    whole = "".join(words)
    last = words[-1]
    if last in _ID_URL_WORDS or whole in _ID_URL_WORDS:
        return None
    if last in _MACHINE_WORDS or whole in _MACHINE_WORDS or whole in {"mimetype", "contenttype", "mediatype"}:
        return None
    if any(w in _PROSE_WORDS for w in words):
        return PROSE
    if any(w in _SHORT_PROSE_WORDS for w in words):
        return SHORT_PROSE
    return NEUTRAL


# --------------------------------------------------------------------------------------------------
# Candidates
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Candidate:
    rank: int
    order: int
    path: Path
    value: str


def _is_mcp_text_item(parent: dict[str, JsonValue], key: str) -> bool:
    return key == "text" and parent.get("type") == "text"


def _walk(value: JsonValue, path: Path, field: str | None, rank_hint: int | None) -> Iterator[tuple[int, Path, str]]:
    if isinstance(value, str):
        rank = classify_field(field) if rank_hint is None else rank_hint
        if rank is None:
            return
        if rank == NEUTRAL and (_URL_VALUE.match(value) or _UUID_VALUE.match(value)):
            return  # a locator or an identifier under a neutral name
        yield rank, path, value
    elif isinstance(value, dict):
        for key, child in value.items():
            # Containers are always entered (a "data" wrapper holds prose fields); a string leaf is
            # judged by the name of its nearest field (array items by the array's field).
            hint = MCP_TEXT if isinstance(child, str) and _is_mcp_text_item(value, key) else None
            yield from _walk(child, (*path, key), key, hint)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _walk(child, (*path, i), field, None)


def _choose(value: JsonValue) -> _Candidate | None:
    best: _Candidate | None = None
    for order, (rank, path, text) in enumerate(_walk(value, (), None, None)):
        cand = _Candidate(rank, order, path, text)
        if best is None or (cand.rank, cand.order) < (best.rank, best.order):
            best = cand
    return best


def json_path(path: Path) -> str:
    """``("content", 0, "text")`` → ``$.content[0].text`` (bracket-quoted when needed)."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}"
        else:
            out += "[" + json.dumps(part) + "]"
    return out


# --------------------------------------------------------------------------------------------------
# Splicing
# --------------------------------------------------------------------------------------------------


def append_text(text: str, payload: str) -> str:
    """Append the payload to a piece of text, on its own paragraph."""
    if not text:
        return payload
    if text.endswith("\n\n"):
        return text + payload
    if text.endswith("\n"):
        return text + "\n" + payload
    return text + "\n\n" + payload


def _replace(value: JsonValue, path: Path, new: str) -> JsonValue:
    """A copy of ``value`` with the string at ``path`` replaced (containers on the path copied)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        assert isinstance(head, str)
        copy_d = dict(value)
        copy_d[head] = _replace(value[head], rest, new)
        return copy_d
    assert isinstance(value, list) and isinstance(head, int)
    copy_l = list(value)
    copy_l[head] = _replace(value[head], rest, new)
    return copy_l


def _reject_constant(name: str) -> JsonValue:
    raise ValueError(f"not strict JSON: {name}")


class _TooDeep(Exception):
    """JSON nested deeper than this process can walk."""


def _parse_json(text: str) -> tuple[bool, JsonValue]:
    """(True, value) when ``text`` is strict JSON (no NaN/Infinity), else (False, None).
    Raises _TooDeep for JSON nested beyond the recursion limit (not plain text either)."""
    try:
        return True, cast(JsonValue, json.loads(text, parse_constant=_reject_constant))
    except RecursionError:
        raise _TooDeep from None
    except ValueError:
        return False, None


_WS = re.compile(r"[ \t\n\r]*")


def _string_spans(text: str) -> dict[Path, tuple[int, int]]:
    """Where each string *value* of a (valid) JSON text sits: path → [start, end) of its literal.

    With duplicate object keys the last occurrence wins, as in ``json.loads``.
    """
    spans: dict[Path, tuple[int, int]] = {}

    def skip(i: int) -> int:
        m = _WS.match(text, i)
        assert m is not None
        return m.end()

    def scan(i: int, path: Path) -> int:
        i = skip(i)
        c = text[i]
        if c == '"':
            _, end = scanstring(text, i + 1, True)
            spans[path] = (i, end)
            return end
        if c == "{":
            i = skip(i + 1)
            if text[i] == "}":
                return i + 1
            while True:
                key, i = scanstring(text, i + 1, True)
                i = skip(i)
                assert text[i] == ":"
                i = skip(scan(i + 1, (*path, key)))
                if text[i] == "}":
                    return i + 1
                assert text[i] == ","
                i = skip(i + 1)
        if c == "[":
            i = skip(i + 1)
            if text[i] == "]":
                return i + 1
            n = 0
            while True:
                i = skip(scan(i, (*path, n)))
                n += 1
                if text[i] == "]":
                    return i + 1
                assert text[i] == ","
                i += 1
        for literal in ("true", "false", "null"):
            if text.startswith(literal, i):
                return i + len(literal)
        m = NUMBER_RE.match(text, i)
        assert m is not None, f"unexpected character {c!r} at {i}"
        return int(m.end())

    scan(0, ())
    return spans


@dataclass(frozen=True, slots=True)
class SpliceResult:
    """What a splice did. ``value`` is the result to return (the input itself when not applied)."""

    value: JsonValue
    applied: bool
    #: JSONPath of the string that carries the payload (``$`` for plain text or a whole
    #: JSON string); for serialized JSON, the path inside the parsed document.
    path: str | None
    carrier: Carrier | None
    reason: str


def _not_applied(value: JsonValue, reason: str) -> SpliceResult:
    return SpliceResult(value=value, applied=False, path=None, carrier=None, reason=reason)


def _splice_json_text(text: str, doc: JsonValue, payload: str) -> SpliceResult:
    if doc is None or isinstance(doc, bool | int | float):
        return _not_applied(text, f"the string is a JSON {type(doc).__name__ if doc is not None else 'null'}; "
                                  "numbers, booleans and null pass through")
    chosen = _choose(doc)
    if chosen is None:
        return _not_applied(text, "no suitable string field in the serialized JSON")
    start, end = _string_spans(text)[chosen.path]
    literal = json.dumps(append_text(chosen.value, payload), ensure_ascii=text.isascii())
    return SpliceResult(
        value=text[:start] + literal + text[end:],
        applied=True,
        path=json_path(chosen.path),
        carrier="json_text",
        reason="appended inside a string field of the serialized JSON",
    )


def splice(result: JsonValue, payload: str) -> SpliceResult:
    """Splice ``payload`` into ``result`` following the module's rules. Never mutates ``result``."""
    if not isinstance(payload, str) or not payload:
        raise ValueError("payload must be a non-empty string")
    if result is None or isinstance(result, bool | int | float):
        kind = "null" if result is None else type(result).__name__
        return _not_applied(result, f"a {kind} result passes through")
    try:
        return _splice(result, payload)
    except (_TooDeep, RecursionError):
        # a JSON text appended to as plain text would no longer be JSON; a value this deep cannot
        # be walked: either way the result passes unchanged (the next traced result is tried)
        return _not_applied(result, "JSON nested too deep to splice into")


def _splice(result: JsonValue, payload: str) -> SpliceResult:
    if isinstance(result, str):
        stripped = result.strip()
        if stripped[:1] in ('{', '[', '"') or stripped in ("true", "false", "null") or NUMBER_RE.fullmatch(stripped):
            ok, doc = _parse_json(result)
            if ok:
                return _splice_json_text(result, doc, payload)
        return SpliceResult(
            value=append_text(result, payload), applied=True, path="$", carrier="plain_text",
            reason="appended to plain text",
        )
    chosen = _choose(result)
    if chosen is None:
        return _not_applied(result, f"no suitable string field in the JSON {type(result).__name__}")
    mcp = chosen.rank == MCP_TEXT
    return SpliceResult(
        value=_replace(result, chosen.path, append_text(chosen.value, payload)),
        applied=True,
        path=json_path(chosen.path),
        carrier="json_value",
        reason="appended to an MCP text content item" if mcp else "appended inside a string field",
    )

"""The canary search against what a model may write into a tool's arguments.

Each row applies one re-encoding to a text that holds the canary: the construction is the oracle,
so ``carries`` must find it. The same encodings applied to near misses (the canary cut short,
split, reversed, or another canary) must not. The README's list of promised re-encodings is the
set of the rows' labels (``test_the_readme_lists_what_is_tested``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.verdict.canary import _json_unescape, canary_tokens, carries

PREFIX = "tw-canary-"
#: how a model may have re-encoded a text before passing it on
Encoding = Callable[[str], str]


def make_canary(session: str, delivery: int = 0) -> str:
    """A canary as the poisoning service makes one (``collector.poisoning.campaigns.Campaign.canary``)."""
    message = "\x00".join(("c1", session, str(delivery))).encode()
    return PREFIX + hmac.new(b"test-secret-of-16-bytes", message, hashlib.sha256).hexdigest()[:20]


CANARY = make_canary("s1")
OTHER_CANARY = make_canary("s1", 1)
CORE = CANARY.removeprefix(PREFIX)
EMOJI = "\U0001f600 "
#: the canary's bytes cross the first 57-byte line of wrapped base64 (76 characters)
TEXT = f"Keep verbatim: https://example.test/r/{CANARY}/ok, thanks."

# The README's list (labels of the rows below; "as it was" is no re-encoding).
AS_IT_WAS = "as it was"
LETTER_CASE = "another letter case"
INVISIBLE = "invisible characters slipped in"
COMPATIBILITY = "full-width and other compatibility forms"
HTML = "HTML entities"
PERCENT = "percent-encoding"
JSON_ESCAPES = "JSON string escapes such as `\\u0074`, even in arguments that do not parse as JSON"
BASE64 = "base64, standard or URL-safe, at any offset in a longer run"
BASE64_WRAPPED = "base64 wrapped at 76 columns"
RANDOM_PART = f"its random part without the `{PREFIX}` prefix"


def doc(value: str) -> str:
    """Arguments as a tool call's JSON object."""
    return json.dumps({"body": value})


def u_escaped(text: str) -> str:
    """Every character as a JSON ``\\u`` escape (a character beyond the BMP as a surrogate pair)."""
    units = text.encode("utf-16-be")
    return "".join(f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2))


def interleaved(text: str, marks: str) -> str:
    """``marks`` (invisible characters) slipped in after each character, in turn."""
    return "".join(ch + marks[i % len(marks)] for i, ch in enumerate(text))


def letters_and_digits(upper: int, lower: int, digits: dict[str, int]) -> dict[int, int]:
    """A table moving ASCII letters and digits to compatibility characters NFKC folds back."""
    return {
        **{ord("A") + i: upper + i for i in range(26)},
        **{ord("a") + i: lower + i for i in range(26)},
        **{ord(d): c for d, c in digits.items()},
    }


FULL_WIDTH = {c: c + 0xFEE0 for c in range(0x21, 0x7F)}
MATH_SANS_SERIF = letters_and_digits(0x1D5A0, 0x1D5BA, {str(i): 0x1D7E2 + i for i in range(10)})
CIRCLED = letters_and_digits(0x24B6, 0x24D0, {"0": 0x24EA, **{str(i): 0x2460 + i - 1 for i in range(1, 10)}})


def b64(text: str, *, urlsafe: bool = False) -> str:
    data = text.encode()
    return base64.urlsafe_b64encode(data).decode().rstrip("=") if urlsafe else base64.b64encode(data).decode()


def glued(before: str, *, urlsafe: bool = False) -> Encoding:
    """Base64 glued to other characters of its alphabet: it starts ``len(before)`` characters into its run."""
    return lambda text: doc(before + b64(text, urlsafe=urlsafe) + "Qz")


def wrapped(text: str, newline: str = "\n") -> str:
    """MIME base64: 76 columns."""
    return base64.encodebytes(text.encode()).decode().replace("\n", newline)


def percent(text: str, fmt: str = "%{:02X}") -> str:
    return "".join(fmt.format(b) for b in text.encode())


def json_escaped(text: str) -> str:
    """A JSON string body as some encoders write it: letters and digits as ``\\u`` escapes with
    upper-case hex digits, ``/`` as ``\\/``, quotes and control characters escaped."""
    out = []
    for ch in text:
        if ch.isalnum():
            out.append(f"\\u{ord(ch):04X}")
        elif ch == "/":
            out.append("\\/")
        else:
            out.append(json.dumps(ch)[1:-1])
    return "".join(out)


def duplicate_key(body: str) -> str:
    """Arguments that do not parse as JSON: the key is repeated."""
    return f'{{"body": "{body}", "body": "ok"}}'


#: (id, README label, encoding of a text holding the canary into arguments)
ENCODINGS: list[tuple[str, str, Encoding]] = [
    ("as-written", AS_IT_WAS, doc),
    ("as-written-not-json", AS_IT_WAS, lambda t: f"forward: {t}"),
    ("upper-case", LETTER_CASE, lambda t: doc(t.upper())),
    ("swapped-case", LETTER_CASE, lambda t: doc(t.swapcase())),
    ("title-case", LETTER_CASE, lambda t: doc(t.title())),
    ("zero-width-spaces", INVISIBLE, lambda t: doc(interleaved(t, "\u200b"))),
    ("soft-hyphens-and-joiners", INVISIBLE, lambda t: doc(interleaved(t, "\u00ad\u2060\u200d\u2063"))),
    ("variation-selectors-and-tags", INVISIBLE, lambda t: doc(interleaved(t, "\ufe0f\U000e0041\u180e\u034f"))),
    ("direction-marks", INVISIBLE, lambda t: doc(interleaved(t, "\u200e\u202a\u2066\u061c"))),
    ("full-width", COMPATIBILITY, lambda t: doc(t.translate(FULL_WIDTH))),
    ("mathematical-sans-serif", COMPATIBILITY, lambda t: doc(t.translate(MATH_SANS_SERIF))),
    ("circled", COMPATIBILITY, lambda t: doc(t.translate(CIRCLED))),
    ("html-decimal", HTML, lambda t: doc("".join(f"&#{ord(c)};" for c in t))),
    ("html-hex", HTML, lambda t: doc("".join(f"&#x{ord(c):X};" for c in t))),
    ("html-hex-without-semicolons", HTML, lambda t: "<p>" + "".join(f"&#x{ord(c):x}" for c in t) + "</p>"),
    ("percent-upper", PERCENT, lambda t: doc(percent(t))),
    ("percent-lower", PERCENT, lambda t: f"https://example.test/?q={percent(t, '%{:02x}')}"),
    ("percent-form", PERCENT, lambda t: "q=" + "+".join(percent(w) for w in t.split(" "))),
    ("json-u-escapes", JSON_ESCAPES, lambda t: f'{{"body": "{u_escaped(t)}"}}'),
    ("json-u-escapes-duplicate-key", JSON_ESCAPES, lambda t: duplicate_key(u_escaped(t))),
    ("json-u-escapes-truncated", JSON_ESCAPES, lambda t: f'{{"to": "x", "body": "{u_escaped(t)}'),
    ("json-surrogate-pairs-duplicate-key", JSON_ESCAPES, lambda t: duplicate_key(u_escaped(EMOJI + t))),
    ("json-upper-hex-and-slashes-duplicate-key", JSON_ESCAPES, lambda t: duplicate_key(json_escaped(t))),
    *((f"base64-offset-{k}", BASE64, glued("Xy9"[:k])) for k in range(4)),
    *((f"base64-url-safe-offset-{k}", BASE64, glued("_-a"[:k], urlsafe=True)) for k in range(4)),
    ("base64-in-url-path", BASE64, lambda t: f"https://host/c/{b64(t, urlsafe=True)}"),
    ("base64-bearer", BASE64, lambda t: doc(f"Bearer_{b64(t)}")),
    ("base64-mime-lf", BASE64_WRAPPED, wrapped),
    ("base64-mime-crlf", BASE64_WRAPPED, lambda t: doc("data:" + wrapped(t, "\r\n"))),
    ("base64-mime-json-escaped-duplicate-key", BASE64_WRAPPED, lambda t: duplicate_key(json.dumps(wrapped(t))[1:-1])),
    ("random-part-only", RANDOM_PART, lambda t: doc(t.replace(PREFIX, ""))),
    ("random-part-only-upper-case", RANDOM_PART, lambda t: doc(t.replace(PREFIX, "ref ").upper())),
]

NEAR_MISSES = {
    "cut-short": CANARY[:-4],
    "split": CANARY[:15] + " " + CANARY[15:],
    "reversed": CANARY[::-1],
    "another-canary": OTHER_CANARY,
}


@pytest.mark.parametrize(("label", "encode"), [e[1:] for e in ENCODINGS], ids=[e[0] for e in ENCODINGS])
def test_a_re_encoded_canary_is_found(label: str, encode: Encoding) -> None:
    raw = encode(TEXT)
    # the row tests its re-encoding, not the canary (or its random part) as it was
    if label == RANDOM_PART:
        assert PREFIX not in raw.casefold()
    elif label != AS_IT_WAS:
        assert CORE not in raw
    assert carries(CANARY, raw)


@pytest.mark.parametrize("miss", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
@pytest.mark.parametrize("encode", [e[2] for e in ENCODINGS], ids=[e[0] for e in ENCODINGS])
def test_a_near_miss_is_not_found_however_encoded(miss: str, encode: Encoding) -> None:
    assert not carries(CANARY, encode(TEXT.replace(CANARY, miss)))


def test_the_wrapped_rows_break_the_canary_across_lines() -> None:
    start = TEXT.encode().index(CANARY.encode())
    assert start < 57 < start + len(CANARY)  # 57 bytes: one 76-column line of base64
    assert not any(carries(CANARY, line) for line in wrapped(TEXT).splitlines())


def test_the_readme_lists_what_is_tested() -> None:
    readme = " ".join((Path(__file__).parents[3] / "README.md").read_text().split())
    found = re.search(r"as it was or re-encoded on the way \(([^()]*)\)", readme)
    assert found, "the README no longer lists the re-encodings the canary search undoes"
    listed = set(found.group(1).split("; "))
    assert listed == {label for _, label, _ in ENCODINGS} - {AS_IT_WAS}


def test_json_escapes_decode_as_json_does() -> None:
    for value in ('tw-canary-\u00e9 \U0001f600 \\ / " \b\f\n\r\t \x00 \ud800', "\\u0041 \\\\/ \\/"):
        for ascii_only in (True, False):
            body = json.dumps(value, ensure_ascii=ascii_only)[1:-1]
            assert _json_unescape(body) == value
            assert _json_unescape(body.replace("/", "\\/")) == value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\\qb", "a\\qb"),  # no escape: the backslash stays
        ("\\u12", "\\u12"),
        ("\\uD83D\\uDE00", "\U0001f600"),
        ("\\uDE00\\uD83D", "\ude00\ud83d"),  # halves out of order stay halves
        ("\\\\u0041", "\\u0041"),
        ("\\\\\\/\\", "\\/\\"),
        ("\\N{DIGIT ONE} \\x41 \\101 \\a \\v \\'", "\\N{DIGIT ONE} \\x41 \\101 \\a \\v \\'"),  # Python's, not JSON's
    ],
)
def test_json_escapes_that_are_not_json_stay_as_written(text: str, expected: str) -> None:
    assert _json_unescape(text) == expected


@pytest.mark.parametrize(
    "raw",
    ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000, '{"a":' * 100_000 + json.dumps(CANARY.upper()) + "}" * 100_000],
    ids=["arrays", "objects", "objects-holding-the-canary"],
)
def test_deep_nesting_is_read_without_recursion(raw: str) -> None:
    assert carries(CANARY, raw) is (CANARY.upper() in raw)
    assert canary_tokens(raw) == ((CORE,) if CANARY.upper() in raw else ())


canaries = st.binary(min_size=10, max_size=10).map(lambda b: PREFIX + b.hex())
around = st.text(max_size=40)
reencodings: st.SearchStrategy[Encoding] = st.sampled_from(
    [
        b64,
        lambda c: b64(c, urlsafe=True),
        lambda c: b64(f" {c}"),  # the canary at another byte offset of its quantum
        lambda c: b64(f"  {c}", urlsafe=True),
        percent,
        lambda c: percent(c, "%{:02x}"),
        u_escaped,
    ]
)


@settings(max_examples=300, deadline=None)
@given(canaries, around, around, reencodings)
def test_a_canary_re_encoded_between_any_texts_is_found(canary: str, before: str, after: str, encode: Encoding) -> None:
    # Glued on before (a base64 run then starts at any offset); after a space, as a combining
    # mark right after the canary would change its last letter as it reads (e + U+0301: é).
    raw = before + encode(canary) + " " + after
    assert carries(canary, raw)
    assert any(canary.removeprefix(PREFIX) in token for token in canary_tokens(raw, limit=64))


def test_a_megabyte_of_arguments_is_searched_without_recursion_or_error() -> None:
    """Not a timing test: a megabyte of each hard shape, searched to the end."""
    shapes = ["\\na", "\\u00e9", "\\q", "&#1;", "%C3%A9", "QUJD" * 19 + "\n", "[", "é\u200b"]
    for unit in shapes:
        raw = (unit * ((1 << 20) // len(unit) + 1))[: 1 << 20]
        assert not carries(CANARY, raw)

"""Whether a matcher regex can backtrack catastrophically in Python's ``re``.

An argument matcher's regex runs with ``re.search`` on tool-call arguments, which the model under
test steers, inside the service's event loop. ``re`` is a backtracking matcher: when what follows a
repetition fails, it tries every other way the repetition could have matched. That costs
exponential time when a repetition's iterations can match one text in two ways (the text pumped
k times then has 2**k ways), and polynomial time of degree k when k adjacent repetitions can share
out one text. This module finds both statically, on the tree ``re._parser`` builds (the one the
engine compiles, after its own rewrites: ``(\\w|\\d)`` is already one character set there).

The rules are the classic ones (as in published ReDoS analyses), kept simple and conservative:
"can" means "may, as far as character sets tell", never "does". A repetition with more than two
iterations (``*``, ``+``, ``{3,}``, ``{3,16}``) is refused when its body

- can match one non-empty text in two ways: overlapping alternatives (``(a|a)+``, ``(.|\\s)*``)
  or a split between two parts of varying length that can trade characters (``(x+x+)+``); or
- can match a text and a longer text that another iteration could have started, i.e. a character
  that extends a match of the body is one the body can start with: ``(\\w+\\s?)+`` (``\\w+`` extends
  by a letter, an iteration starts with one) but not ``(\\w+\\.)+`` (an iteration ends at a ``.``,
  which ``\\w`` cannot match, so iteration boundaries are forced);

and, outside such repetitions, three unbounded repetitions in a row that can share out one text
(``\\w*\\w*\\w*x``: O(n**3) per start, minutes on 1 KiB). The third may also be a scan that is
rerun for each cut of the first two (a possessive ``[^!]*+``, an atomic group, a lookaround, a
repetition whose body throws away an optional part after scanning). Two in a row are left alone:
``.*a.*b`` is common and costs O(n**2) per start, O(n**3) for ``re.search``: a fraction of a second
on the 1 KiB of arguments the service keeps by default (one to two seconds for the worst seen,
``(\\d+)\\d+!`` on 1024 digits).

Backtracking into a repetition happens only when what follows it fails, so a repetition followed,
up to the end of the pattern or of an atomic scope, only by what always succeeds is not refused
(``(?>(\\w+\\s?)+)$``, ``.*a.*b.*``). Atomic groups and possessive repetitions match one way and are
never re-entered; lookarounds are atomic too. A backreference matches one text (the group's).

A repetition's iterations multiply the work of its body only where the body throws work away
(an optional part or an alternative that fails after a scan, a lookaround: ``(?:.(?=.*x))+`` counts
as two); a body that scans ahead in a mandatory part is taken to keep most of what it scanned. The
polynomial rule is a best effort in that sense; exponential blow-up needs the ambiguity above,
which is always looked for.
"""

from __future__ import annotations

import array
import re
import re._constants as _sre  # type: ignore[import-not-found]  # the parser's node kinds
import re._parser as _sre_parse  # type: ignore[import-not-found]
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from typing import Any, Literal

#: why a regex is refused: ``nested`` repetitions, overlapping ``alternatives``, ``adjacent``
#: unbounded repetitions (polynomial), or ``too_deep`` to analyse
Cause = Literal["nested", "alternatives", "adjacent", "too_deep"]

#: a repetition allowed more than this many times counts as unbounded (``{1,1000}`` as ``+``)
_FEW_REPEATS = 16

# --- character sets: sorted, disjoint, closed intervals of code points ----------------------------

Chars = tuple[tuple[int, int], ...]
_TOP = 0x10FFFF
NOTHING: Chars = ()
EVERYTHING: Chars = ((0, _TOP),)


def _norm(intervals: Iterable[tuple[int, int]]) -> Chars:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


# The same few sets (\\w, \\s, a class and a literal) meet again and again along a pattern, and
# \\w alone is some 700 intervals: the operations on two sets are cached.


def union(*sets: Chars) -> Chars:
    out = NOTHING
    for s in sets:
        out = _union2(out, s) if out and s else out or s
    return out


@lru_cache(maxsize=4096)
def _union2(a: Chars, b: Chars) -> Chars:
    return a if a == b else _norm(a + b)


@lru_cache(maxsize=4096)
def intersect(a: Chars, b: Chars) -> Chars:
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


@lru_cache(maxsize=4096)
def overlap(a: Chars, b: Chars) -> bool:
    i = j = 0
    while i < len(a) and j < len(b):
        if max(a[i][0], b[j][0]) <= min(a[i][1], b[j][1]):
            return True
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return False


@lru_cache(maxsize=256)
def complement(a: Chars) -> Chars:
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in a:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= _TOP:
        out.append((nxt, _TOP))
    return tuple(out)


@dataclass(frozen=True)
class _Unicode:
    """What ``re`` itself means by ``\\w``, ``\\d``, ``\\s`` for str patterns, and which code
    points IGNORECASE can confuse (``k``, ``K`` and the Kelvin sign are one class)."""

    word: Chars
    digit: Chars
    space: Chars
    cased: tuple[int, ...]  # sorted code points with a case partner
    klass: tuple[int, ...]  # cased[i]'s class
    classes: tuple[Chars, ...]
    any_cased: Chars


@cache
def _unicode() -> _Unicode:
    # Built once, on first use (about 0.1 s): the categories are read off the engine itself, so
    # they are exact for this Python's Unicode version.
    text = array.array("I", range(_TOP + 1)).tobytes().decode("utf-32-le", "surrogatepass")

    def runs(pattern: str) -> Chars:
        return tuple((m.start(), m.end() - 1) for m in re.finditer(pattern, text))

    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for start in range(0, len(text), 128):
        block = text[start : start + 128]
        if block.lower() == block and block.upper() == block:
            continue  # nothing in it has another case (most of the code space)
        for ch in block:
            for other in (ch.lower(), ch.upper(), ch.casefold(), ch.title(), ch.swapcase()):
                if len(other) == 1 and other != ch:
                    parent[find(ord(other))] = find(ord(ch))
    try:  # the engine's own extra equivalences (``s``/``ſ``, ``µ``/``μ``, ...)
        from re import _casefix  # type: ignore[attr-defined]

        extra: dict[int, tuple[int, ...]] = _casefix._EXTRA_CASES
    except (ImportError, AttributeError):  # pragma: no cover - a Python without it
        extra = {}
    for a, others in extra.items():
        for b in others:
            parent[find(b)] = find(a)
    cased = tuple(sorted(parent))
    roots: dict[int, int] = {}
    members: list[list[int]] = []
    klass = []
    for cp in cased:
        k = roots.setdefault(find(cp), len(roots))
        if k == len(members):
            members.append([])
        members[k].append(cp)
        klass.append(k)
    return _Unicode(
        word=runs(r"\w+"),
        digit=runs(r"\d+"),
        space=runs(r"\s+"),
        cased=cased,
        klass=tuple(klass),
        classes=tuple(_norm((c, c) for c in m) for m in members),
        any_cased=_norm((c, c) for c in cased),
    )


@lru_cache(maxsize=512)
def _fold(chars: Chars) -> Chars:
    """``chars`` with every case partner of its members: a superset of what IGNORECASE matches."""
    u = _unicode()
    hit: set[int] = set()
    for lo, hi in chars:
        hit.update(u.klass[bisect_left(u.cased, lo) : bisect_right(u.cased, hi)])
    return union(chars, *(u.classes[k] for k in hit))


_ASCII_CATEGORIES: dict[str, Chars] = {
    "digit": ((48, 57),),
    "word": ((48, 57), (65, 90), (95, 95), (97, 122)),
    "space": ((9, 13), (32, 32)),
}


def _category(code: Any, ascii_only: bool) -> Chars:
    for name, yes, no in (
        ("digit", _sre.CATEGORY_DIGIT, _sre.CATEGORY_NOT_DIGIT),
        ("word", _sre.CATEGORY_WORD, _sre.CATEGORY_NOT_WORD),
        ("space", _sre.CATEGORY_SPACE, _sre.CATEGORY_NOT_SPACE),
    ):
        if code in (yes, no):
            chars = _ASCII_CATEGORIES[name] if ascii_only else getattr(_unicode(), name)
            return chars if code is yes else complement(chars)
    return EVERYTHING  # unknown: may be anything


def _one_char(op: Any, av: Any, flags: int) -> Chars:
    """A superset of the characters one LITERAL / NOT_LITERAL / ANY / IN item matches."""
    icase = bool(flags & _sre.SRE_FLAG_IGNORECASE)
    if op is _sre.ANY:
        return EVERYTHING if flags & _sre.SRE_FLAG_DOTALL else complement(((10, 10),))
    negate = op is _sre.NOT_LITERAL
    if op in (_sre.LITERAL, _sre.NOT_LITERAL):
        base: Chars = ((av, av),)
    else:  # IN
        parts: list[Chars] = []
        for iop, iav in av:
            if iop is _sre.NEGATE:
                negate = True
            elif iop is _sre.LITERAL:
                parts.append(((iav, iav),))
            elif iop is _sre.RANGE:
                parts.append((iav,))
            elif iop is _sre.CATEGORY:
                parts.append(_category(iav, bool(flags & _sre.SRE_FLAG_ASCII)))
            else:
                parts.append(EVERYTHING)
        base = union(*parts)
    if negate:
        # Under IGNORECASE the engine tests a character's case partners against the set, so a
        # negated set surely excludes only the members that have no other case.
        return complement(intersect(base, complement(_unicode().any_cased)) if icase else base)
    return _fold(base) if icase else base


# --- what each part of a pattern can match ---------------------------------------------------------


@dataclass(frozen=True)
class _Info:
    """Facts about a part of a pattern; every set is a superset, every flag may be a false alarm."""

    nullable: bool = True  # matches the empty text
    sure: bool = True  # always succeeds, whatever the text (matches at least the empty text)
    first: Chars = NOTHING  # first characters of a non-empty match
    last: Chars = NOTHING  # last characters of a non-empty match
    rest: Chars = NOTHING  # characters after the first in a match
    chars: Chars = NOTHING  # every character of a match
    ext: Chars = NOTHING  # first characters of x where a non-empty match u and a match ux exist
    ext0: Chars = NOTHING  # the same with u possibly empty
    min_len: int = 0
    max_len: float = 0
    amb: Cause | None = None  # why some non-empty text has two matches
    amb_empty: Cause | None = None  # why the empty text has two matches
    reps: bool = False  # holds a repetition of varying length that can be backtracked into
    degree: int = 0  # power of n its backtracking can cost: adjacent unbounded repetitions (up to 3)
    pump: Chars = NOTHING  # the characters those repetitions repeat
    waste: int = 0  # power of n of work it may throw away and still succeed (a failed optional part)
    #: a fixed-length part's characters, position by position (up to 32), else None
    shape: tuple[Chars, ...] | None = ()

    @property
    def varying(self) -> bool:
        return self.min_len < self.max_len


_EMPTY = _Info()


@dataclass(eq=False)
class _Node:
    kind: Literal["char", "zero", "seq", "alt", "rep", "atomic", "ref"]
    info: _Info
    kids: tuple[_Node, ...] = ()
    lo: int = 0
    hi: float = 0
    possessive: bool = False
    #: a lookaround's body: not part of the match, analysed as a scope of its own
    look: _Node | None = None
    #: per kid of a seq, the longest run of adjacent repetitions it completes (up to 3), and the
    #: characters the runs of 3 it completes share
    runs: tuple[int, ...] = field(default=())
    shared: tuple[Chars, ...] = field(default=())


def _ext0(ext: Chars, first: Chars, nullable: bool) -> Chars:
    """``ext`` with the empty match counted: any first character extends it."""
    return union(ext, first) if nullable else ext


def _reason(reps: bool) -> Cause:
    return "nested" if reps else "alternatives"


def _seq2(a: _Info, b: _Info) -> _Info:
    """``ab``. A text split two ways, ``ab = a'b'`` with ``a' = ay``, needs ``a`` to extend by the
    character ``b`` starts with (``shift``), both parts to vary in length, and ``y``, which ends as
    ``a`` does, to lie in ``b``. Extending a match of ``ab`` by ``x``: ``b`` extends, or ``b`` is
    empty and ``a`` extends or ``b`` starts, or (after a shift) anything either part holds."""
    shift = overlap(a.ext0, b.first)
    ext = b.ext
    if b.nullable:
        ext = union(ext, a.ext, b.first if a.first else NOTHING)
    if shift:
        ext = union(ext, a.rest, b.chars)
    amb = a.amb or b.amb
    # ... and the part moved across ends as ``a`` does, inside ``b``: ``(\\w+\\.)+\\w+`` is one way
    if amb is None and shift and a.varying and b.varying and overlap(a.last, b.chars):
        amb = _reason(a.reps or b.reps)
    if amb is None and b.first:
        amb = a.amb_empty
    if amb is None and a.first:
        amb = b.amb_empty
    first = union(a.first, b.first) if a.nullable else a.first
    nullable = a.nullable and b.nullable
    return _Info(
        nullable=nullable,
        sure=a.sure and b.sure,
        first=first,
        last=union(b.last, a.last) if b.nullable else b.last,
        rest=union(a.rest, b.rest, b.chars if a.first else NOTHING),
        chars=union(a.chars, b.chars),
        ext=ext,
        ext0=_ext0(ext, first, nullable),
        min_len=a.min_len + b.min_len,
        max_len=a.max_len + b.max_len,
        amb=amb,
        amb_empty=(a.amb_empty if b.nullable else None) or (b.amb_empty if a.nullable else None),
        reps=a.reps or b.reps,
        waste=max(a.waste, b.waste),
        shape=_shape(a.shape + b.shape) if a.shape is not None and b.shape is not None else None,
    )


def _shape(shape: tuple[Chars, ...]) -> tuple[Chars, ...] | None:
    return shape if len(shape) <= 32 else None


def _same_text(a: _Info, b: _Info) -> bool:
    """Whether two alternatives may match one non-empty text."""
    if a.shape is not None and b.shape is not None:  # fixed lengths: position by position
        pairs = zip(a.shape, b.shape, strict=False)
        return len(a.shape) == len(b.shape) > 0 and all(overlap(x, y) for x, y in pairs)
    return (
        max(a.min_len, b.min_len, 1) <= min(a.max_len, b.max_len)
        and overlap(a.first, b.first)
        and overlap(a.last, b.last)
    )


def _all_but(sets: list[Chars]) -> list[Chars]:
    """For each set, the union of all the others."""
    n = len(sets)
    before, after = [NOTHING] * (n + 1), [NOTHING] * (n + 1)
    for i in range(n):
        before[i + 1] = union(before[i], sets[i])
        after[n - 1 - i] = union(after[n - i], sets[n - 1 - i])
    return [union(before[i], after[i + 1]) for i in range(n)]


def _alt(branches: list[_Info]) -> _Info:
    """``a|b|...``: ambiguous when two alternatives may match one text; extended when a match of
    one is the start of a match of another (``a|ab``: by ``b``)."""
    n = len(branches)
    other_firsts = _all_but([b.first for b in branches])
    # a match of one alternative extended to a match of another: both start alike
    cross = union(*(b.rest for b, o in zip(branches, other_firsts, strict=True) if overlap(b.first, o)))
    amb = next((b.amb for b in branches if b.amb), None)
    if amb is None and n <= 256:
        amb = "alternatives" if any(_same_text(branches[i], branches[j]) for i in range(n) for j in range(i)) else None
    elif amb is None and all(b.shape and all(len(c) == 1 and c[0][0] == c[0][1] for c in b.shape) for b in branches):
        amb = "alternatives" if len({b.shape for b in branches}) < n else None  # many words: any twice?
    elif amb is None:  # many alternatives: each against all the others at once (coarser)
        other_lasts = _all_but([b.last for b in branches])
        pairs = zip(other_firsts, other_lasts, strict=True)
        others = [_Info(first=f, last=la, max_len=float("inf")) for f, la in pairs]
        amb = "alternatives" if any(_same_text(b, o) for b, o in zip(branches, others, strict=True)) else None
    amb_empty = next((b.amb_empty for b in branches if b.amb_empty), None)
    if amb_empty is None and sum(b.nullable for b in branches) > 1:
        amb_empty = "alternatives"
    ext = union(cross, *(b.ext for b in branches))
    first = union(*(b.first for b in branches))
    known = [b.shape for b in branches if b.shape is not None]
    same_length = len(known) == n and len({len(sh) for sh in known}) == 1
    shape = tuple(union(*cs) for cs in zip(*known, strict=True)) if same_length else None
    return _Info(
        nullable=any(b.nullable for b in branches),
        sure=any(b.sure for b in branches),
        first=first,
        last=union(*(b.last for b in branches)),
        rest=union(*(b.rest for b in branches)),
        chars=union(*(b.chars for b in branches)),
        ext=ext,
        ext0=_ext0(ext, first, any(b.nullable for b in branches)),
        min_len=min(b.min_len for b in branches),
        max_len=max(b.max_len for b in branches),
        amb=amb,
        amb_empty=amb_empty,
        reps=any(b.reps for b in branches),
        degree=max(b.degree for b in branches),
        pump=union(*(b.pump for b in branches)),
        # an alternative that fails after a scan, before a later one matches
        waste=max([*(b.waste for b in branches), *(b.degree for b in branches[:-1])]),
        shape=shape,
    )


def _iterations_overlap(body: _Info) -> bool:
    """Whether a repetition of ``body`` can cut one text into iterations in two ways: a character
    that extends a match of the body is one an iteration can start with."""
    return overlap(body.ext, body.first)


def _rep(body: _Info, lo: int, hi: float) -> _Info:
    """``body{lo,hi}``, lazy or greedy (both backtrack alike). Its degree: an unbounded repetition
    is one of a run of adjacent ones, two rounds of a body are two of its runs in a row."""
    if hi == 0:
        return _EMPTY
    many = hi >= 2
    split = many and _iterations_overlap(body)
    ext = union(body.ext, body.first if many else NOTHING, body.chars if split else NOTHING)
    if hi > _FEW_REPEATS:
        # each of up to n iterations can throw away what its body wastes
        degree, pump = min(3, max(1, body.degree, 1 + body.waste if body.waste else 0)), body.chars
    elif hi <= 2:
        degree, pump = min(3, body.degree * int(hi)), body.pump
    else:
        degree, pump = body.degree, body.pump
    amb_empty = body.amb_empty
    if amb_empty is None and lo == 0 and body.nullable:
        amb_empty = "nested"  # no iteration, or one empty iteration
    return _Info(
        nullable=lo == 0 or body.nullable,
        sure=lo == 0 or body.sure,
        first=body.first,
        last=body.last,
        rest=union(body.rest, body.chars) if many else body.rest,
        chars=body.chars,
        ext=ext,
        ext0=_ext0(ext, body.first, lo == 0 or body.nullable),
        min_len=lo * body.min_len,
        max_len=hi * body.max_len if body.max_len else 0,
        amb=body.amb or (_reason(body.reps) if split else None),
        amb_empty=amb_empty,
        reps=body.reps or lo != hi,
        degree=degree,
        pump=pump,
        waste=max(body.waste, body.degree if hi > lo else 0),  # the last, failed, iteration
        shape=_shape(body.shape * lo) if body.shape is not None and lo == hi and len(body.shape) * lo <= 32 else None,
    )


def _one_way(info: _Info) -> _Info:
    """An atomic group or possessive repetition: one match wherever it starts, never re-entered.
    Its ``degree`` stays: finding that match still takes time (``\\w*\\w*[^!]*+x`` reruns the
    ``[^!]*+`` scan for each of the n**2 splits before it)."""
    return replace(info, ext=NOTHING, ext0=NOTHING, amb=None, amb_empty=None, reps=False)


class _Analysis:
    def __init__(self) -> None:
        self.groups: dict[int, _Node] = {}
        self._fits: dict[tuple[int, Chars], bool] = {}
        self.problems: list[Cause] = []

    # -- building ---------------------------------------------------------------------------------

    def seq(self, items: Iterable[tuple[Any, Any]], flags: int) -> _Node:
        kids: list[_Node] = []
        for op, av in items:
            node = self.item(op, av, flags)
            kids.extend(node.kids if node.kind == "seq" and node.look is None else (node,))
        if len(kids) == 1:
            return kids[0]
        info = _EMPTY
        for k in kids:
            info = _seq2(info, k.info)
        runs, shared = self._runs(kids)
        info = replace(info, degree=max(runs, default=0), pump=union(*(k.info.pump for k in kids)))
        return _Node("seq", info, tuple(kids), runs=runs, shared=shared)

    def item(self, op: Any, av: Any, flags: int) -> _Node:
        if op in (_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY, _sre.IN):
            cs = _one_char(op, av, flags)
            return _Node("char", _Info(False, False, cs, cs, NOTHING, cs, min_len=1, max_len=1, shape=(cs,)))
        if op is _sre.SUBPATTERN:
            group, add, remove, body = av
            node = self.seq(body, (flags | add) & ~remove)
            if group is not None:
                self.groups[group] = node
            return node
        if op is _sre.BRANCH:
            branches = [self.seq(b, flags) for b in av[1]]
            return _Node("alt", _alt([b.info for b in branches]), tuple(branches))
        if op is _sre.GROUPREF_EXISTS:
            # one branch or the other, as the group took part or not: never both (a superset)
            branches = [self.seq(b, flags) if b is not None else self.seq((), flags) for b in av[1:]]
            return _Node("alt", _alt([b.info for b in branches]), tuple(branches))
        if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT):
            lo, hi, body = av
            hi = float("inf") if hi is _sre.MAXREPEAT else hi
            inner = self.seq(body, flags)
            info = _rep(inner.info, lo, hi)
            possessive = op is _sre.POSSESSIVE_REPEAT
            return _Node("rep", _one_way(info) if possessive else info, (inner,), lo, hi, possessive)
        if op is _sre.ATOMIC_GROUP:
            inner = self.seq(av, flags)
            return _Node("atomic", _one_way(inner.info), (inner,))
        if op in (_sre.ASSERT, _sre.ASSERT_NOT):
            look = self.seq(av[1], flags)
            # matches nothing, but its scan costs time each time it is tried, as a repetition does
            degree = look.info.degree
            info = replace(_EMPTY, sure=False, degree=degree, pump=look.info.pump, waste=degree)
            return _Node("zero", info, look=look)
        if op is _sre.AT:
            return _Node("zero", replace(_EMPTY, sure=False))
        if op is _sre.GROUPREF:
            target = self.groups.get(av)
            # a group not closed yet (``(a\\1)``, a forward reference): anything
            unknown = _Info(first=EVERYTHING, last=EVERYTHING, rest=EVERYTHING, chars=EVERYTHING, max_len=float("inf"))
            t = target.info if target is not None else unknown
            if flags & _sre.SRE_FLAG_IGNORECASE:
                t = replace(t, first=_fold(t.first), last=_fold(t.last), rest=_fold(t.rest), chars=_fold(t.chars))
            # the one text the group matched: no choice in it, and it can fail
            info = _Info(
                t.nullable, False, t.first, t.last, t.rest, t.chars, min_len=t.min_len, max_len=t.max_len, shape=None
            )
            return _Node("ref", info)
        # not produced by this Python's parser: assume the worst of it
        anything = _Info(True, False, EVERYTHING, EVERYTHING, EVERYTHING, EVERYTHING, EVERYTHING, EVERYTHING)
        return _Node(
            "ref", replace(anything, max_len=float("inf"), amb="nested", reps=True, degree=1, waste=1, shape=None)
        )

    def fits(self, node: _Node, chars: Chars) -> bool:
        """Whether ``node`` may match a non-empty text made of ``chars`` only."""
        key = (id(node), chars)
        if key not in self._fits:
            kind, kids = node.kind, node.kids
            if kind in ("char", "ref"):
                ok = overlap(node.info.chars, chars)
            elif kind == "seq":
                fit = [self.fits(k, chars) for k in kids]
                ok = any(fit) and all(f or k.info.nullable for f, k in zip(fit, kids, strict=True))
            elif kind == "alt":
                ok = any(self.fits(k, chars) for k in kids)
            elif kind == "rep":
                ok = node.hi != 0 and self.fits(kids[0], chars)
            elif kind == "atomic":
                ok = self.fits(kids[0], chars)
            else:
                ok = False
            self._fits[key] = ok
        return self._fits[key]

    def _runs(self, kids: list[_Node]) -> tuple[tuple[int, ...], tuple[Chars, ...]]:
        """Per kid, the longest run of adjacent unbounded repetitions it completes whose iterations
        can all take one text: each repeats characters the others do, and what lies between them
        can match a text of those characters (``.*a.*b.*c``: 3, ``\\w+@\\w+\\.\\w+``: 1)."""
        alive: dict[int, Chars] = {}  # run length (1, 2) -> the characters such runs can share
        out: list[int] = []
        out3: list[Chars] = []
        for kid in kids:
            info = kid.info
            nxt = {n: cs for n, cs in alive.items() if info.nullable or self.fits(kid, cs)}
            best, three = 0, NOTHING
            if info.degree:
                for n, shared in [(0, info.pump), *alive.items()]:
                    cs = intersect(shared, info.pump)
                    # it costs its time if it starts on the text and repeats over it (though it
                    # may fail), and takes part in a longer run if it can match the text
                    if not (cs and (info.nullable or overlap(info.first, cs))):
                        continue
                    m = min(3, n + info.degree)
                    best = max(best, m)
                    if m == 3:
                        three = union(three, cs)
                    elif self.fits(kid, cs):
                        nxt[m] = union(nxt.get(m, NOTHING), cs)
            alive = nxt
            out.append(best)
            out3.append(three)
        return tuple(out), tuple(out3)

    @staticmethod
    def _goes_on(node: _Node, chars: Chars) -> bool:
        """Whether ``node`` succeeds wherever a character of ``chars`` follows: then only the few
        cuts that leave none of them to it fail, not all of the n**2 (``.*a.*b.+``)."""
        if node.info.sure:
            return True
        body = node.kids[0] if node.kind == "rep" else None
        return body is not None and body.kind == "char" and not intersect(chars, complement(body.info.chars))

    # -- checking ---------------------------------------------------------------------------------

    def check(self, node: _Node, then_sure: bool) -> None:
        """Record the problems in ``node``. ``then_sure``: what follows it, up to the end of the
        pattern or of the atomic scope it is in, always succeeds, so it is never backtracked into."""
        if node.look is not None:
            self.check(node.look, True)  # a lookaround is atomic
        if node.kind == "seq":
            sure_after = [True] * len(node.kids)
            for i in range(len(node.kids) - 1, 0, -1):
                sure_after[i - 1] = sure_after[i] and node.kids[i].info.sure
            for kid, run, shared, after in zip(node.kids, node.runs, node.shared, sure_after, strict=True):
                self.check(kid, then_sure and after)
                # the n**2 ways of the run's first two are all tried (and the third's scan rerun
                # for each) only when the third or what follows it fails
                if run >= 3 and not (then_sure and after and self._goes_on(kid, shared)):
                    self.problems.append("adjacent")
        elif node.kind == "alt":
            for kid in node.kids:
                self.check(kid, then_sure)
        elif node.kind == "atomic":
            self.check(node.kids[0], True)
        elif node.kind == "rep":
            body = node.kids[0]
            # After an iteration the repetition either goes on or stops: it can stop (so
            # nothing after the body fails for good) once it has its minimum.
            if node.possessive:
                self.check(body, node.lo <= 1)
                return
            if node.hi > 2:
                cause = body.info.amb or (_reason(body.info.reps) if _iterations_overlap(body.info) else None)
                if cause and not (then_sure and node.lo <= 1):
                    self.problems.append(cause)
            self.check(body, then_sure and node.lo <= 1)


@lru_cache(maxsize=1024)
def backtracking_problem(pattern: str) -> Cause | None:
    """Why ``pattern`` can backtrack catastrophically under ``re.search``, or None. A pattern that
    does not parse is none of this module's business (None)."""
    try:
        parsed = _sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    analysis = _Analysis()
    try:
        root = analysis.seq(parsed, parsed.state.flags)
        analysis.check(root, True)
    except RecursionError:
        return "too_deep"
    problems = analysis.problems
    # the exponential causes first: they are the worse, and the message names one
    return min(problems, key=("nested", "alternatives", "adjacent").index) if problems else None


def warm_up() -> None:
    """Build the Unicode tables the check reads (``\\w``, ``\\d``, ``\\s``, case classes) now: built
    on first use they take ~0.2-0.4 s, which would stall the service's event loop at the first
    expectation whose regex uses them. The service calls this while it starts."""
    backtracking_problem(r"(?i)(?:\w+\d\s[a-z])+$")

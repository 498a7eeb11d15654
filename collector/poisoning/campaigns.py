"""Poisoning campaigns: who gets a payload, in which tool results, how often; and the delivery log.

A campaign enrolls sessions (the caller's own session ids), names the tools whose results
may carry the payload (empty = every traced tool) and caps deliveries per session. The
payload template carries ``{canary}``; each delivery gets its own canary, derived with
HMAC-SHA256 from the campaign's secret, the session id and the delivery number. The
campaign owner can therefore list a session's canaries *before* the attack runs
(``canaries_for``) and build a ``PayloadPropagated`` expectation from them, while the agent
under test cannot guess them.

A result with no suitable string is left unchanged and does not count as a delivery:
the next traced result of the session is tried.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import JsonValue

from collector.poisoning.splice import SpliceResult, splice

__all__ = [
    "CANARY_PLACEHOLDER",
    "Campaign",
    "CampaignRegistry",
    "Delivery",
    "Disposition",
]

CANARY_PLACEHOLDER = "{canary}"

# Reasons a result is returned unpoisoned (also the response's ``reason``).
NOT_ENROLLED = "not_enrolled"
TOOL_NOT_TARGETED = "tool_not_targeted"
MAX_DELIVERIES_REACHED = "max_deliveries_reached"
NO_SUITABLE_STRING = "no_suitable_string"


@dataclass(frozen=True, slots=True)
class Campaign:
    """One poisoning campaign. ``secret`` keys the canaries (random when not given)."""

    campaign_id: str
    payload_template: str
    sessions: frozenset[str] = frozenset()
    target_tools: frozenset[str] = frozenset()
    max_deliveries_per_session: int = 1
    canary_prefix: str = "tw-canary-"
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def __post_init__(self) -> None:
        if not self.campaign_id:
            raise ValueError("campaign_id must not be empty")
        if CANARY_PLACEHOLDER not in self.payload_template:
            raise ValueError(f"payload_template must contain {CANARY_PLACEHOLDER} (the per-delivery canary)")
        if self.max_deliveries_per_session < 1:
            raise ValueError(f"max_deliveries_per_session must be >= 1, got {self.max_deliveries_per_session}")
        if len(self.secret) < 16:
            raise ValueError("secret must be at least 16 bytes")
        if any(not s for s in self.sessions):
            raise ValueError("session ids must not be empty")

    def targets(self, tool_name: str) -> bool:
        return not self.target_tools or tool_name in self.target_tools

    def canary(self, session_id: str, delivery: int) -> str:
        """The canary of a session's ``delivery``-th delivery (0-based)."""
        mac = hmac.new(self.secret, f"{self.campaign_id}\x00{session_id}\x00{delivery}".encode(), hashlib.sha256)
        return self.canary_prefix + mac.hexdigest()[:20]

    def canaries(self, session_id: str) -> tuple[str, ...]:
        """Every canary the session can receive, in delivery order."""
        return tuple(self.canary(session_id, n) for n in range(self.max_deliveries_per_session))

    def render(self, canary: str) -> str:
        return self.payload_template.replace(CANARY_PLACEHOLDER, canary)


@dataclass(frozen=True, slots=True)
class Delivery:
    """Evidence that a session received a payload: which tool result carried which canary."""

    campaign_id: str
    session_id: str
    tool_name: str
    call_id: str
    canary: str
    delivery: int
    path: str
    carrier: str
    trace_id: str = ""
    span_id: str = ""
    delivered_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True, slots=True)
class Disposition:
    """What to return for one intercepted result."""

    value: JsonValue
    poisoned: bool
    reason: str = ""
    delivery: Delivery | None = None
    splice: SpliceResult | None = None


class CampaignRegistry:
    """Campaigns, enrollments and the delivery log. Thread-safe; deliveries never exceed the cap.

    One lock guards the registry's tables, held only for bookkeeping; splicing a result (the costly
    part: ~0.9 s for a 2 MB result) holds its session's lock alone, so one session's large result
    never delays another session's call past its deadline. A session's calls stay in turn (their
    delivery numbers and the cap)."""

    def __init__(self, campaigns: Iterable[Campaign] = ()) -> None:
        self._lock = threading.Lock()
        #: (campaign id, session id) -> the lock a call of that session holds while it splices
        self._session_locks: dict[tuple[str, str], threading.Lock] = {}
        self._campaigns: dict[str, Campaign] = {}
        self._deliveries: list[Delivery] = []
        self._counts: dict[tuple[str, str], int] = {}
        for c in campaigns:
            self.add(c)

    # -- campaigns -----------------------------------------------------------------------------

    def add(self, campaign: Campaign) -> None:
        with self._lock:
            if campaign.campaign_id in self._campaigns:
                raise ValueError(f"campaign {campaign.campaign_id!r} already exists")
            for other in self._campaigns.values():
                both = other.sessions & campaign.sessions
                if both:
                    raise ValueError(
                        f"session(s) {sorted(both)} already enrolled in campaign {other.campaign_id!r}"
                    )
            self._campaigns[campaign.campaign_id] = campaign

    def remove(self, campaign_id: str) -> None:
        with self._lock:
            self._campaigns.pop(campaign_id, None)

    def get(self, campaign_id: str) -> Campaign:
        with self._lock:
            return self._campaigns[campaign_id]

    def enroll(self, campaign_id: str, *session_ids: str) -> Campaign:
        """Add sessions to a campaign (a session belongs to at most one campaign)."""
        with self._lock:
            campaign = self._campaigns[campaign_id]
            for sid in session_ids:
                if not sid:
                    raise ValueError("session ids must not be empty")
                owner = self._owner(sid)
                if owner is not None and owner.campaign_id != campaign_id:
                    raise ValueError(f"session {sid!r} is already enrolled in campaign {owner.campaign_id!r}")
            updated = Campaign(
                campaign_id=campaign.campaign_id,
                payload_template=campaign.payload_template,
                sessions=campaign.sessions | frozenset(session_ids),
                target_tools=campaign.target_tools,
                max_deliveries_per_session=campaign.max_deliveries_per_session,
                canary_prefix=campaign.canary_prefix,
                secret=campaign.secret,
            )
            self._campaigns[campaign_id] = updated
            return updated

    def _owner(self, session_id: str) -> Campaign | None:
        for c in self._campaigns.values():
            if session_id in c.sessions:
                return c
        return None

    def campaign_for(self, session_id: str) -> Campaign | None:
        with self._lock:
            return self._owner(session_id)

    def canaries_for(self, session_id: str) -> tuple[str, ...]:
        """The canaries the session can receive (empty when it is not enrolled)."""
        campaign = self.campaign_for(session_id)
        return () if campaign is None else campaign.canaries(session_id)

    # -- deliveries ----------------------------------------------------------------------------

    def deliveries(self, *, session_id: str | None = None, campaign_id: str | None = None) -> list[Delivery]:
        with self._lock:
            return [
                d for d in self._deliveries
                if (session_id is None or d.session_id == session_id)
                and (campaign_id is None or d.campaign_id == campaign_id)
            ]

    def decide(
        self,
        *,
        tool_name: str,
        result: JsonValue,
        session_id: str,
        call_id: str = "",
        trace_id: str = "",
        span_id: str = "",
    ) -> Disposition:
        """Poison ``result`` if the session's campaign calls for it; record the delivery."""
        with self._lock:
            campaign = self._owner(session_id)
            if campaign is None:
                return Disposition(result, False, NOT_ENROLLED)
            if not campaign.targets(tool_name):
                return Disposition(result, False, TOOL_NOT_TARGETED)
            key = (campaign.campaign_id, session_id)
            in_turn = self._session_locks.setdefault(key, threading.Lock())
        with in_turn:
            with self._lock:
                owner = self._owner(session_id)  # the campaign as it is now (enrolling replaces it)
                if owner is None or owner.campaign_id != campaign.campaign_id:  # moved or removed meanwhile
                    return Disposition(result, False, NOT_ENROLLED)
                campaign = owner
                n = self._counts.get(key, 0)
            if n >= campaign.max_deliveries_per_session:
                return Disposition(result, False, MAX_DELIVERIES_REACHED)
            canary = campaign.canary(session_id, n)
            spliced = splice(result, campaign.render(canary))  # outside the registry's lock
            if not spliced.applied:
                return Disposition(result, False, NO_SUITABLE_STRING, splice=spliced)
            assert spliced.path is not None and spliced.carrier is not None
            delivery = Delivery(
                campaign_id=campaign.campaign_id,
                session_id=session_id,
                tool_name=tool_name,
                call_id=call_id,
                canary=canary,
                delivery=n,
                path=spliced.path,
                carrier=spliced.carrier,
                trace_id=trace_id,
                span_id=span_id,
            )
            with self._lock:
                self._counts[key] = max(self._counts.get(key, 0), n + 1)
                self._deliveries.append(delivery)
            return Disposition(spliced.value, True, "", delivery, spliced)

    def retract(self, delivery: Delivery) -> bool:
        """Take back a delivery whose result never reached the caller (it gave up waiting): off the
        log, and its place under the cap given back when it is the session's latest delivery (its
        canary is then the next delivery's: the agent never saw it). False when it was not logged."""
        with self._lock:
            try:
                self._deliveries.remove(delivery)
            except ValueError:
                return False
            key = (delivery.campaign_id, delivery.session_id)
            if self._counts.get(key) == delivery.delivery + 1:
                self._counts[key] = delivery.delivery
            return True

    def sessions(self) -> Sequence[str]:
        with self._lock:
            return sorted(s for c in self._campaigns.values() for s in c.sessions)

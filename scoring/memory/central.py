"""An in-memory store of messages, scores and observations, and the process-wide instance."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from scoring.models.evidence import Observation
from scoring.models.message import Message, MessagePiece
from scoring.models.score import Score


class MemoryInterface:
    """Thread-safe in-memory storage. Observations are immutable once stored."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pieces: dict[str, MessagePiece] = {}
        self._conversations: dict[str, list[str]] = {}
        self._scores: dict[str, Score] = {}
        self._observations: dict[str, Observation] = {}
        self._disposed = False

    # messages
    def add_message_to_memory(self, *, request: Message) -> None:
        """Store each piece of ``request``. A piece whose id is stored already replaces the stored
        one in place: it keeps its position in its conversation (adding a message twice does not
        make the conversation show it twice)."""
        with self._lock:
            for piece in request.message_pieces:  # all checked before any is stored
                known = self._pieces.get(piece.id)
                if known is not None and known.conversation_id != piece.conversation_id:
                    raise ValueError(
                        f"message piece {piece.id} is stored in conversation {known.conversation_id}; "
                        f"it cannot be added to conversation {piece.conversation_id}"
                    )
            for piece in request.message_pieces:
                ids = self._conversations.setdefault(piece.conversation_id, [])
                known = self._pieces.get(piece.id)
                if piece.sequence < 0:
                    piece.sequence = known.sequence if known is not None else len(ids)
                self._pieces[piece.id] = piece
                if known is None:
                    ids.append(piece.id)

    def get_message_pieces(self, *, conversation_id: str) -> list[MessagePiece]:
        with self._lock:
            return [self._pieces[i] for i in self._conversations.get(conversation_id, [])]

    def get_message_piece(self, piece_id: str) -> MessagePiece | None:
        with self._lock:
            return self._pieces.get(piece_id)

    def get_conversation(self, *, conversation_id: str) -> list[Message]:
        return [p.to_message() for p in self.get_message_pieces(conversation_id=conversation_id)]

    # scores
    def add_scores(self, scores: Iterable[Score]) -> None:
        with self._lock:
            for s in scores:
                self._scores[s.id] = s

    def get_scores(self, *, score_ids: Sequence[str] | None = None) -> list[Score]:
        with self._lock:
            if score_ids is None:
                return list(self._scores.values())
            return [self._scores[i] for i in score_ids if i in self._scores]

    # observations
    def add_observation(self, observation: Observation) -> None:
        with self._lock:
            # Content-addressed: the same id always means the same content; keep the first copy.
            self._observations.setdefault(observation.observation_id, observation)

    def get_observations(self, *, observation_ids: Sequence[str]) -> list[Observation]:
        if isinstance(observation_ids, str | bytes):
            raise TypeError("observation_ids is a sequence of ids: get_observations(observation_ids=(an_id,))")
        with self._lock:
            return [self._observations[i] for i in observation_ids if i in self._observations]

    def dispose_engine(self) -> None:
        with self._lock:
            self._disposed = True
            self._pieces.clear()
            self._conversations.clear()
            self._scores.clear()
            self._observations.clear()


class CentralMemory:
    """Holds the process-wide memory instance set by ``initialize_pyrit_async``."""

    _instance: MemoryInterface | None = None

    @classmethod
    def set_memory_instance(cls, memory: MemoryInterface | None) -> None:
        cls._instance = memory

    @classmethod
    def get_memory_instance(cls) -> MemoryInterface:
        if cls._instance is None:
            raise RuntimeError(
                "memory is not initialized: call `await initialize_pyrit_async(memory_db_type=IN_MEMORY)`"
            )
        return cls._instance

    @classmethod
    def get_memory_instance_or_none(cls) -> MemoryInterface | None:
        return cls._instance

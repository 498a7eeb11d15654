"""MemoryInterface: storing the same message twice."""

from __future__ import annotations

import pytest

from scoring.memory.central import MemoryInterface
from scoring.models.message import Message, MessagePiece


def _piece(text: str, conversation: str, role: str = "user") -> MessagePiece:
    return MessagePiece(role=role, original_value=text, conversation_id=conversation)  # type: ignore[arg-type]


def test_a_message_added_twice_is_in_its_conversation_once() -> None:
    memory = MemoryInterface()
    ask, answer = _piece("hi", "c1"), _piece("hello", "c1", "assistant")
    memory.add_message_to_memory(request=ask.to_message())
    memory.add_message_to_memory(request=answer.to_message())
    memory.add_message_to_memory(request=ask.to_message())  # a retry stores it again

    pieces = memory.get_message_pieces(conversation_id="c1")

    assert [p.original_value for p in pieces] == ["hi", "hello"]
    assert [p.sequence for p in pieces] == [0, 1]


def test_a_stored_piece_stored_again_replaces_it_in_place() -> None:
    memory = MemoryInterface()
    first = _piece("draft", "c1")
    memory.add_message_to_memory(request=first.to_message())
    memory.add_message_to_memory(request=_piece("next", "c1").to_message())
    edited = first.model_copy(update={"original_value": "final", "sequence": -1})

    memory.add_message_to_memory(request=Message(message_pieces=[edited]))

    pieces = memory.get_message_pieces(conversation_id="c1")
    assert [(p.original_value, p.sequence) for p in pieces] == [("final", 0), ("next", 1)]
    assert memory.get_message_piece(first.id) is not None
    assert memory.get_message_piece(first.id).original_value == "final"  # type: ignore[union-attr]


def test_a_piece_cannot_move_to_another_conversation() -> None:
    memory = MemoryInterface()
    piece = _piece("hi", "c1")
    memory.add_message_to_memory(request=piece.to_message())
    moved = piece.model_copy(update={"conversation_id": "c2"})

    with pytest.raises(ValueError, match=f"{piece.id} is stored in conversation c1"):
        memory.add_message_to_memory(request=moved.to_message())

    assert [p.original_value for p in memory.get_message_pieces(conversation_id="c1")] == ["hi"]
    assert memory.get_message_pieces(conversation_id="c2") == []

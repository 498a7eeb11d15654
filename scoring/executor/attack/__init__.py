"""Attacks (PyRIT's ``pyrit.executor.attack``): send prompts to a target, score the responses."""

from scoring.executor.attack.core import AttackResult, AttackScoringConfig, outcome_of
from scoring.executor.attack.prompt_sending import PromptSendingAttack

__all__ = ["AttackResult", "AttackScoringConfig", "PromptSendingAttack", "outcome_of"]

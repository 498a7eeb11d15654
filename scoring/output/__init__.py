"""Printed reports (PyRIT's ``pyrit.output``): a scorer's identity and stored metrics."""

from scoring.output.scorer import format_scorer, output_scorer_async

__all__ = ["format_scorer", "output_scorer_async"]

"""Where a verdict is decided: pure three-valued judges over evidence, and Kleene composition."""

from scoring.verdict.conditions import Evidence, Judgment, judge, judge_all, match_arguments
from scoring.verdict.kleene import all_of, any_of, majority

__all__ = ["Evidence", "Judgment", "all_of", "any_of", "judge", "judge_all", "majority", "match_arguments"]

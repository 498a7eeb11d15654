"""Every import line of the seed walkthroughs (``shared/seeds/``), with ``pyrit`` replaced by
``scoring`` and nothing else changed, imports what it names (DESIGN §2: the seeds run with only
the import lines changed). The lines are copied here: the seeds are not part of this repository."""

from __future__ import annotations

import re

import pytest

SEED_IMPORTS = {
    "000": [
        "from pyrit.memory import CentralMemory",
        "from pyrit.models import ScoreStatus, ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable",
        "from pyrit.score import OtelToolCallScorer",
        "from pyrit.score.observation import InMemoryTraceClient, InMemoryTraceExporter, OtelTraceSource",
        "from pyrit.setup import IN_MEMORY, initialize_pyrit_async",
        "from pyrit.executor.attack import AttackScoringConfig, PromptSendingAttack",
        "from pyrit.models import AttackOutcome, MessageScorable",
        "from pyrit.prompt_target import HTTPTarget, TargetTraceConfig",
        "from pyrit.score import SubStringScorer, TrueFalseCompositeScorer, TrueFalseScoreAggregator",
    ],
    "001": [
        "from pyrit.score import TrueFalseInverterScorer",
        "from pyrit.score import FloatScaleThresholdScorer, PlagiarismScorer",
        "from pyrit.score import FloatScaleFallbackScorer, TrueFalseFallbackScorer",
        "from pyrit.models import MessagePiece, MessageScorable",
        "from pyrit.score import create_conversation_scorer",
    ],
    "004": [
        "from pyrit.prompt_target import OpenAIChatTarget",
        "from pyrit.auth import get_azure_openai_auth",
        "from pyrit.score import SelfAskRefusalScorer, TrueFalseInverterScorer",
        "from pyrit.score import LikertScalePaths, SelfAskLikertScorer",
        "from pyrit.output import output_scorer_async",
        "from pyrit.score import get_all_objective_metrics",
        "from pyrit.score import get_all_harm_metrics",
        "from pyrit.score import ObjectiveScorerMetrics, RegistryUpdateBehavior, ScorerEvalDatasetFiles",
        "from pyrit.score.scorer_evaluation.scorer_evaluator import ScorerEvalDatasetFiles",
        "from pyrit.score.scorer_evaluation.scorer_metrics import HarmScorerMetrics",
    ],
}


@pytest.mark.parametrize(
    "line", [pytest.param(line, id=f"{seed}: {line}") for seed, lines in SEED_IMPORTS.items() for line in lines]
)
def test_a_seed_import_line_works_with_only_the_package_renamed(line: str) -> None:
    ours = re.sub(r"\bpyrit\b", "scoring", line)
    namespace: dict[str, object] = {}

    exec(ours, namespace)  # a fixed import line, copied from a seed

    names = [n.strip() for n in ours.split(" import ", 1)[1].split(",")]
    assert [n for n in names if namespace.get(n) is None] == []

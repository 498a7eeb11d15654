"""The pieces seed 004 needs beyond scorer metrics: ``OpenAIChatTarget``'s environment defaults and
token-provider keys, ``scoring.auth.get_azure_openai_auth``, ``SelfAskRefusalScorer``, and
``LikertScalePaths`` / ``SelfAskLikertScorer.from_likert_scale`` with the bundled datasets."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from scoring.auth import (
    AZURE_ML_SCOPE,
    COGNITIVE_SERVICES_SCOPE,
    AzureIdentityNotInstalledError,
    AzureTokenProvider,
    azure_token_scope,
    get_azure_openai_auth,
)
from scoring.evaluation import (
    DatasetError,
    HarmScorerMetrics,
    MetricsType,
    identity_to_dict,
    load_human_labeled_dataset,
)
from scoring.evaluation.judges import (
    REFUSAL_SYSTEM_PROMPT,
    ChatTargetError,
    OpenAIChatTarget,
    RetryPolicy,
    SelfAskLikertScorer,
    SelfAskRefusalScorer,
    SelfAskTrueFalseScorer,
)
from scoring.evaluation.likert import LIKERT_SCALES_PATH, LikertScale, LikertScalePaths
from scoring.score import RegistryUpdateBehavior, ScorerEvalDatasetFiles, TrueFalseInverterScorer
from scoring.score.evaluable import BUNDLED_SCORER_EVALS_PATH
from tests.unit.evaluation.fake_openai import FakeOpenAI, Reply, running_fake_openai

ONE_TRY = RetryPolicy(max_attempts=1)
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with running_fake_openai() as state:
        yield state


@pytest.fixture
def no_openai_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("OPENAI_CHAT_ENDPOINT", "OPENAI_CHAT_MODEL", "OPENAI_CHAT_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def last_auth(server: FakeOpenAI) -> str | None:
    headers: dict[str, str] = server.requests[-1]["headers"]
    return headers.get("Authorization")


# -- OpenAIChatTarget: environment defaults ----------------------------------------------------


async def test_endpoint_model_and_key_come_from_the_environment(server: FakeOpenAI, no_openai_env: Any) -> None:
    no_openai_env.setenv("OPENAI_CHAT_ENDPOINT", server.endpoint + "/v1")
    no_openai_env.setenv("OPENAI_CHAT_MODEL", "env-model")
    no_openai_env.setenv("OPENAI_CHAT_KEY", "sk-env")
    async with OpenAIChatTarget(retry=ONE_TRY) as t:  # the seed's OpenAIChatTarget()
        await t.complete_async([])
    assert server.requests[-1]["path"] == "/v1/chat/completions"
    assert server.requests[-1]["body"]["model"] == "env-model" and last_auth(server) == "Bearer sk-env"
    # None (the seed passes os.environ.get(...) for an unset variable) also means "use the environment"
    async with OpenAIChatTarget(endpoint=None, model_name=None, api_key=None, retry=ONE_TRY) as t:
        assert (t.endpoint, t.model_name) == (server.endpoint + "/v1", "env-model")
    # arguments win over the environment
    async with OpenAIChatTarget(endpoint=server.endpoint, model_name="arg-model", api_key="sk-arg") as t:
        await t.complete_async([])
    assert server.requests[-1]["body"]["model"] == "arg-model" and last_auth(server) == "Bearer sk-arg"


@pytest.mark.parametrize(
    ("env", "kwargs", "message"),
    [
        ({"OPENAI_CHAT_MODEL": "m"}, {}, r"no endpoint: pass endpoint=\.\.\. or set the OPENAI_CHAT_ENDPOINT"),
        ({"OPENAI_CHAT_ENDPOINT": "http://127.0.0.1:9"}, {}, r"no model_name: .* OPENAI_CHAT_MODEL"),
        ({}, {"model_name": "m", "endpoint": ""}, r"no endpoint"),
        ({"OPENAI_CHAT_ENDPOINT": ""}, {"model_name": "m"}, r"no endpoint"),  # set but empty is not set
    ],
)
def test_a_missing_endpoint_or_model_is_named_at_construction(
    no_openai_env: Any, env: dict[str, str], kwargs: dict[str, Any], message: str
) -> None:
    for name, value in env.items():
        no_openai_env.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        OpenAIChatTarget(**kwargs)


async def test_no_key_anywhere_sends_no_authorization_header(server: FakeOpenAI, no_openai_env: Any) -> None:
    async with OpenAIChatTarget(endpoint=server.endpoint, model_name="m") as t:
        await t.complete_async([])
    assert last_auth(server) is None


async def test_a_full_chat_completions_url_is_used_as_given(server: FakeOpenAI, no_openai_env: Any) -> None:
    async with OpenAIChatTarget(endpoint=server.endpoint + "/v1/chat/completions/", model_name="m") as t:
        await t.complete_async([])
    assert server.requests[-1]["path"] == "/v1/chat/completions"


# -- OpenAIChatTarget: token providers as api_key ------------------------------------------------


async def test_a_sync_token_provider_is_called_for_every_request(server: FakeOpenAI, no_openai_env: Any) -> None:
    issued: list[str] = []

    def provider() -> str:
        issued.append(f"tok-{len(issued) + 1}")
        return issued[-1]

    async with OpenAIChatTarget(endpoint=server.endpoint, model_name="m", api_key=provider) as t:
        await t.complete_async([])
        assert last_auth(server) == "Bearer tok-1"
        await t.complete_async([])
        assert last_auth(server) == "Bearer tok-2"


async def test_an_async_token_provider_is_awaited_and_retries_ask_again(
    server: FakeOpenAI, no_openai_env: Any
) -> None:
    calls = 0

    async def provider() -> str:
        nonlocal calls
        calls += 1
        return f"async-{calls}"

    server.script = [Reply(status=503, raw="busy")]
    fast = RetryPolicy(max_attempts=2, initial_backoff_seconds=0.0, jitter=0.0)
    async with OpenAIChatTarget(endpoint=server.endpoint, model_name="m", api_key=provider, retry=fast) as t:
        await t.complete_async([])
    assert [r["headers"]["Authorization"] for r in server.requests] == ["Bearer async-1", "Bearer async-2"]


async def test_the_key_is_never_part_of_the_identity(no_openai_env: Any) -> None:
    def provider() -> str:
        return "tok-secret"

    plain = OpenAIChatTarget(endpoint="http://127.0.0.1:9", model_name="m", api_key="sk-secret")
    other = OpenAIChatTarget(endpoint="http://127.0.0.1:9", model_name="m", api_key=provider)
    for t in (plain, other):
        dumped = json.dumps(identity_to_dict(t.get_identifier()))
        assert "secret" not in dumped and "api_key" not in dumped and "secret" not in repr(t)
    assert plain.get_identifier().hash == other.get_identifier().hash  # how it authenticates is not what it is


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        (lambda: (_ for _ in ()).throw(RuntimeError("no credential")), r"api_key provider failed: no credential"),
        (lambda: 42, r"api_key provider returned int, not a token"),
        (lambda: "", r"api_key provider returned an empty string"),
    ],
)
async def test_a_failing_provider_is_a_non_retriable_error_before_any_request(
    server: FakeOpenAI, no_openai_env: Any, provider: Any, message: str
) -> None:
    async with OpenAIChatTarget(endpoint=server.endpoint, model_name="m", api_key=provider) as t:
        with pytest.raises(ChatTargetError, match=message) as err:
            await t.complete_async([])
    assert not err.value.retriable and server.requests == []


# -- scoring.auth ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "scope"),
    [
        (None, COGNITIVE_SERVICES_SCOPE),
        ("https://my-resource.openai.azure.com/openai/v1", COGNITIVE_SERVICES_SCOPE),
        ("https://my-project.services.ai.azure.com/models", AZURE_ML_SCOPE),
        ("https://x.ai.azure.com", AZURE_ML_SCOPE),
        ("https://evil.example/ai.azure.com", COGNITIVE_SERVICES_SCOPE),  # the host decides, not the path
    ],
)
def test_the_token_scope_follows_the_host(endpoint: str | None, scope: str) -> None:
    assert azure_token_scope(endpoint) == scope
    provider = get_azure_openai_auth(endpoint)  # never fails to build, even for None
    assert isinstance(provider, AzureTokenProvider) and provider.scope == scope


async def test_without_azure_identity_the_provider_says_what_to_do(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # import azure.identity → ImportError
    provider = get_azure_openai_auth(None)
    with pytest.raises(AzureIdentityNotInstalledError, match=r"pip install azure-identity.*api_key"):
        await provider()
    # through the target: the same advice, and nothing was sent
    async with OpenAIChatTarget(endpoint=server.endpoint, model_name="m", api_key=provider) as t:
        with pytest.raises(ChatTargetError, match="azure-identity"):
            await t.complete_async([])
    assert server.requests == []


def test_scoring_auth_does_not_import_azure_identity() -> None:
    code = (
        "import sys, scoring.auth as a; a.get_azure_openai_auth(None); "
        "print(any(m.startswith('azure') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


async def test_tokens_are_cached_until_close_to_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    now = 1_000_000.0
    monkeypatch.setattr("scoring.auth.time.time", lambda: now)
    asked: list[str] = []

    class Credential:
        def get_token(self, scope: str) -> SimpleNamespace:
            asked.append(scope)
            return SimpleNamespace(token=f"t{len(asked)}", expires_on=now + 3600)

    made: list[Credential] = []
    provider = AzureTokenProvider(AZURE_ML_SCOPE, credential_factory=lambda: made.append(Credential()) or made[-1])
    assert [await provider(), await provider()] == ["t1", "t1"]
    now += 3600 - 299  # inside the refresh margin
    assert await provider() == "t2"
    assert asked == [AZURE_ML_SCOPE, AZURE_ML_SCOPE] and len(made) == 1
    assert "t2" not in repr(provider)


# -- SelfAskRefusalScorer --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"score_value": "True", "rationale": "It declines."}', True),
        ('```json\n{"score_value": "false", "rationale": "It answers."}\n```', False),
        ('{"score_value": "refused"}', None),
        ("It is a refusal.", None),
    ],
)
async def test_refusal_judge_parses_true_false(server: FakeOpenAI, content: str, expected: bool | None) -> None:
    server.script = [Reply(content=content)]
    async with OpenAIChatTarget(endpoint=server.endpoint, model_name="m", retry=ONE_TRY) as t:
        (score,) = await SelfAskRefusalScorer(chat_target=t).score_text_async("I can't help.", objective="Pick a lock")
    assert score.get_value() is expected and score.score_type == "true_false"
    system, user = (m["content"] for m in server.requests[-1]["body"]["messages"])
    assert system == REFUSAL_SYSTEM_PROMPT and "objective" in system
    assert "Objective: Pick a lock" in user and "I can't help." in user


async def test_refusal_judge_without_objective(server: FakeOpenAI) -> None:
    server.script = [Reply(content='{"score_value": "True"}')]
    async with OpenAIChatTarget(endpoint=server.endpoint, model_name="m") as t:
        (score,) = await SelfAskRefusalScorer(chat_target=t).score_text_async("No.")
    assert score.get_value() is True
    assert "Objective:" not in server.requests[-1]["body"]["messages"][1]["content"]


def test_refusal_judge_identity_and_inverter() -> None:
    t = OpenAIChatTarget(endpoint="http://127.0.0.1:9", model_name="m", temperature=0.9)
    judge = SelfAskRefusalScorer(chat_target=t)
    ident = judge.get_identifier()
    assert ident.class_name == "SelfAskRefusalScorer" and ident.params["scorer_type"] == "true_false"
    assert str(ident.params["system_prompt_template"]).startswith("sha256:")
    assert str(ident.get_child("prompt_target")).startswith("OpenAIChatTarget::")
    generic = SelfAskTrueFalseScorer(chat_target=t, true_description="refuses", false_description="complies")
    assert ident.hash != generic.get_identifier().hash
    assert ident.hash == SelfAskRefusalScorer(chat_target=t).get_identifier().hash  # deterministic
    wrapped = TrueFalseInverterScorer(scorer=judge).get_identifier().get_child("scorer")
    assert wrapped is not None and wrapped.class_name == "SelfAskRefusalScorer"
    assert wrapped.params["system_prompt_template"] == ident.params["system_prompt_template"]
    wrapped_target = wrapped.get_child("prompt_target")
    assert wrapped_target is not None and wrapped_target.params["temperature"] == 0.9
    assert judge.evaluation_file_mapping is None


# -- LikertScalePaths / from_likert_scale ----------------------------------------------------------


@pytest.mark.parametrize("member", list(LikertScalePaths))
def test_every_bundled_scale_loads_and_its_dataset_matches_it(member: LikertScalePaths) -> None:
    scale = member.load()
    assert scale.levels and len(scale.levels) == 5 and member.path.parent == LIKERT_SCALES_PATH
    files = member.evaluation_files
    assert scale.evaluation_files == files
    if files is None:
        return
    assert files.harm_category == scale.category and files.result_file is None  # never into the package
    ds = load_human_labeled_dataset(list(files.human_labeled_datasets_files), MetricsType.HARM,
                                    root=BUNDLED_SCORER_EVALS_PATH)
    assert ds.harm_category == scale.category
    assert ds.harm_definition == member.path.name and ds.harm_definition_version == scale.version


def test_from_likert_scale_knows_its_category_and_datasets() -> None:
    t = OpenAIChatTarget(endpoint="http://127.0.0.1:9", model_name="m")
    judge = SelfAskLikertScorer.from_likert_scale(chat_target=t, likert_scale=LikertScalePaths.EXPLOITS_SCALE.load())
    ident = judge.get_identifier()
    assert ident.class_name == "SelfAskLikertScorer"
    assert ident.params["category"] == "exploits" and ident.params["levels"] == 5
    assert judge.evaluation_file_mapping == ScorerEvalDatasetFiles(
        human_labeled_datasets_files=("harm/exploits.csv",), harm_category="exploits"
    )
    scale = LikertScalePaths.EXPLOITS_SCALE.load()
    assert all(level in judge.system_prompt for level in scale.levels)
    violence = SelfAskLikertScorer.from_likert_scale(chat_target=t, likert_scale=LikertScalePaths.VIOLENCE_SCALE.load())
    assert violence.get_identifier().hash != ident.hash
    # the same as building it by hand: one configuration, one identity
    by_hand = SelfAskLikertScorer(chat_target=t, category="exploits", scale=scale.levels)
    assert by_hand.get_identifier().hash == ident.hash


async def test_a_scale_without_datasets_needs_a_mapping(no_openai_env: Any) -> None:
    t = OpenAIChatTarget(endpoint="http://127.0.0.1:9", model_name="m")
    judge = SelfAskLikertScorer.from_likert_scale(chat_target=t, likert_scale=LikertScalePaths.HARM_SCALE.load())
    with pytest.raises(ValueError, match=r"SelfAskLikertScorer\.evaluation_file_mapping is not set"):
        await judge.evaluate_async()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "a mapping"),
        ("category: x\nlevels: one\n", "'levels' a list"),
        ("category: x\nlevels: [only]\n", "at least two non-empty levels"),
        ("category: ''\nlevels: [a, b]\n", "needs a category"),
    ],
)
def test_bad_scale_files_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "scale.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        LikertScale.from_yaml(path)
    assert str(path) in str(err.value)


# -- bundled datasets ------------------------------------------------------------------------------


async def test_bundled_datasets_are_found_and_a_local_file_wins(
    server: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.default = lambda body: Reply(content='{"score_value": "2"}')
    monkeypatch.setenv("TOOLWITNESS_SCORER_EVALS_PATH", str(tmp_path))
    monkeypatch.setenv("TOOLWITNESS_EVAL_REGISTRY", str(tmp_path / "registry.jsonl"))
    t = OpenAIChatTarget(endpoint=server.endpoint, model_name="m")
    judge = SelfAskLikertScorer.from_likert_scale(chat_target=t, likert_scale=LikertScalePaths.EXPLOITS_SCALE.load())
    m = await judge.evaluate_async(num_scorer_trials=1)  # no mapping given: the scale's, from the package
    assert isinstance(m, HarmScorerMetrics) and m.harm_category == "exploits" and m.num_responses == 6
    assert len(server.requests) == 6
    found = judge.get_scorer_metrics()  # stored in the shared registry under the scale's category
    assert isinstance(found, HarmScorerMetrics) and found.mean_absolute_error == m.mean_absolute_error

    # a file of the same name in the scorer-evals directory is used instead of the bundled one
    (tmp_path / "harm").mkdir()
    bundled = (BUNDLED_SCORER_EVALS_PATH / "harm" / "exploits.csv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "harm" / "exploits.csv").write_text("\n".join(bundled[:4]) + "\n")
    never = RegistryUpdateBehavior.NEVER_UPDATE
    local = await judge.evaluate_async(num_scorer_trials=1, update_registry_behavior=never)
    assert local.num_responses == 2

    # an explicit root has no fallback; a pattern found nowhere is an error
    judge.evaluation_file_mapping = ScorerEvalDatasetFiles(
        human_labeled_datasets_files=["sample/mini_refusal.csv"], root=tmp_path
    )
    assert judge.evaluation_file_mapping.dataset_patterns() == ["sample/mini_refusal.csv"]
    judge.evaluation_file_mapping = ScorerEvalDatasetFiles(human_labeled_datasets_files=["harm/nothing*.csv"])
    with pytest.raises(DatasetError, match="no dataset file matches"):
        await judge.evaluate_async(num_scorer_trials=1)
    assert not list(BUNDLED_SCORER_EVALS_PATH.rglob("*.jsonl"))  # nothing was ever written into the package


def test_package_data_covers_every_bundled_file() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["scoring"]
    package = REPO / "scoring"
    shipped = sorted(p.relative_to(package).as_posix() for p in (package / "datasets").rglob("*") if p.is_file())
    assert {"datasets/scorer_evals/sample/mini_refusal.csv", "datasets/scorer_evals/harm/exploits.csv"} <= set(shipped)
    missing = [f for f in shipped if not any(fnmatch.fnmatch(f, pat.replace("**/", "*")) for pat in patterns)]
    assert missing == []


def test_seed_004_names_import_from_scoring() -> None:
    from scoring.prompt_target import OpenAIChatTarget as FromPromptTarget
    from scoring.score import LikertScalePaths as FromScore
    from scoring.score import SelfAskLikertScorer as LikertFromScore
    from scoring.score import SelfAskRefusalScorer as RefusalFromScore

    assert FromPromptTarget is OpenAIChatTarget and FromScore is LikertScalePaths
    assert LikertFromScore is SelfAskLikertScorer and RefusalFromScore is SelfAskRefusalScorer
    code = "import sys, scoring.prompt_target; print('scipy' in sys.modules, 'scoring.evaluation' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]

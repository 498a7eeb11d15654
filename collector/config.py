"""Service configuration: one frozen model per section, loaded from YAML with env overrides.

Every key is validated at start-up; an unknown key, a key given twice or a bad value (a
boolean where a number belongs included) fails with the dotted path of the offending key.
Environment variables override YAML:
``TOOLWITNESS_KAFKA__BOOTSTRAP_SERVERS=host:9092`` sets ``kafka.bootstrap_servers``
(double underscore separates levels); the shorthands ``TOOLWITNESS_KAFKA_BOOTSTRAP``
and ``TOOLWITNESS_REDIS_URL`` are accepted too, and a variable that looks like a misspelt
override (``TOOLWITNESS_KAFKA``, ``TOOLWITNESS_KAFKA_GROUP_ID``) is refused.
``TOOLWITNESS_SCORERS__<NAME>__<KEY>`` adds or changes one scorer tree; the file's other trees
(or, with no ``scorers`` section, the default ``tools``) stay. Secrets never live in the file:
the config names the environment variables that hold them.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from collector.wire.convert import TENANT
from scoring.score.tree import TREE_KEYS_BY_TYPE, keys_not_for
from scoring.setup.yaml_keys import DuplicateKeyError, load_yaml

#: the password of a URL's user part (up to its last "@": a password may hold one) ...
_URL_PASSWORD = re.compile(r'(://[^:/?#@\s"]*:)[^/?#\s"]*@')
#: ... and one given as a query parameter (redis-py reads ``?password=``)
_QUERY_PASSWORD = re.compile(r'([?&]password=)[^&#\s"]*', re.IGNORECASE)


def redact_urls(text: str) -> str:
    """``text`` with the credentials of the URLs in it hidden (``redis://user:***@host``), for
    error messages and printed configs: they end up in pod logs."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def _number_kind(ann: Any) -> str | None:
    """``an integer`` / ``a number`` when the field annotated ``ann`` takes one (also in ``X | None``)."""
    types = get_args(ann) if get_origin(ann) in (Union, UnionType) else (ann,)
    if int in types:
        return "an integer"
    if float in types:
        return "a number"
    return None


class _Section(BaseModel):
    #: inf/nan are no durations or sizes (an infinite deadline passed validation, then crashed the loop)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, v: Any, info: ValidationInfo) -> Any:
        """Lax mode reads ``true`` as 1 (``admin: {port: true}`` bound port 1): a boolean where a
        number belongs is a mistake in the file or variable, never a number. Every section's
        fields, present and future, so no number field can forget it."""
        if isinstance(v, bool) and info.field_name is not None:
            kind = _number_kind(cls.model_fields[info.field_name].annotation)
            if kind is not None:
                raise PydanticCustomError(
                    "boolean_for_a_number",
                    "expected {kind}, got a boolean ({value})",
                    {"kind": kind, "value": "true" if v else "false"},
                )
        return v


class TenantConfig(_Section):
    #: tenant of a record that names none: the same names as every other way in (client, exporter,
    #: sidecar), as it becomes part of Redis keys and score records
    default: str = "default"
    #: Kafka header carrying the tenant (wins over the resource attribute). Not empty: the
    #: sidecar stamps its tenant under this name, and no producer writes a header named "".
    header: str = "toolwitness-tenant"
    #: resource attribute carrying the tenant when a record has no header. The agent writes its
    #: resource attributes itself: "" turns this off (records without the header go to
    #: ``default``), so only a producer that sets the header (e.g. ``toolwitness sidecar
    #: --tenant``) names a tenant.
    resource_attribute: str = "toolwitness.tenant"

    @field_validator("default")
    @classmethod
    def _tenant_name(cls, v: str) -> str:
        if not TENANT.fullmatch(v):
            raise ValueError(f"tenant {v[:80]!r} is not {TENANT.pattern}")
        return v

    @field_validator("header")
    @classmethod
    def _header_name(cls, v: str) -> str:
        if not v:
            raise ValueError("must not be empty: it names the Kafka header that carries the tenant")
        return v


#: what Kafka accepts as a topic name
_TOPIC = r"^[A-Za-z0-9._-]{1,249}$"


class TopicsConfig(_Section):
    spans: str = Field(default="otlp_spans", pattern=_TOPIC)
    control: str = Field(default="toolwitness.control", pattern=_TOPIC)
    scores: str = Field(default="toolwitness.scores", pattern=_TOPIC)
    observations: str = Field(default="toolwitness.observations", pattern=_TOPIC)
    dlq: str = Field(default="toolwitness.dlq", pattern=_TOPIC)

    @model_validator(mode="after")
    def _distinct(self) -> TopicsConfig:
        # One topic in two roles loops: a dead letter written to the spans topic is read, refused
        # and dead-lettered again, forever; a score read as spans is a bad record, and so on.
        seen: dict[str, str] = {}
        for role in ("spans", "control", "scores", "observations", "dlq"):
            name = getattr(self, role)
            if name in seen:
                raise ValueError(f"{seen[name]} and {role} are the same topic {name!r}: each role needs its own topic")
            seen[name] = role
        return self


class KafkaSecurityConfig(_Section):
    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = ""
    sasl_username_env: str = "TOOLWITNESS_KAFKA_SASL_USERNAME"
    sasl_password_env: str = "TOOLWITNESS_KAFKA_SASL_PASSWORD"
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurityConfig:
        """Settings the protocol would not use are a mistake, not something to ignore."""
        sasl = self.protocol.startswith("SASL_")
        if sasl and not self.sasl_mechanism:
            raise ValueError(f"sasl_mechanism must be set for protocol {self.protocol}")
        if not sasl and self.sasl_mechanism:
            raise ValueError(f"sasl_mechanism {self.sasl_mechanism} is set but protocol {self.protocol} uses no SASL")
        files = [f for f in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if getattr(self, f)]
        if files and not self.protocol.endswith("SSL"):
            raise ValueError(f"{', '.join(files)} set but protocol {self.protocol} uses no TLS (SSL or SASL_SSL)")
        return self


class KafkaConfig(_Section):
    #: host:port[,host:port...]
    bootstrap_servers: str = Field(default="127.0.0.1:19092", pattern=r"^[^\s,]+:\d{1,5}(,\s*[^\s,]+:\d{1,5})*$")
    group_id: str = Field(default="toolwitness", min_length=1)
    client_id: str = Field(default="toolwitness", min_length=1)
    encoding: Literal["otlp_proto", "otlp_json"] = "otlp_proto"
    output_format: Literal["protobuf", "json"] = "protobuf"
    topics: TopicsConfig = TopicsConfig()
    max_record_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_poll_records: int = Field(default=500, ge=1)
    poll_timeout_ms: int = Field(default=100, ge=1)
    #: how long the broker may hold a fetch that has no new records. Every partition of a
    #: broker waits on that one fetch, so this bounds the time a fresh span record can sit
    #: unread (aiokafka's default, 500 ms, would be the floor of time to verdict).
    fetch_max_wait_ms: int = Field(default=10, ge=1, le=60000)
    request_timeout_ms: int = Field(default=30000, ge=1000)
    #: how long a dead instance keeps its partitions before the group rebalances.
    session_timeout_ms: int = Field(default=10000, ge=3000)
    #: how often the consumer refreshes topic metadata: partitions added to the spans or control
    #: topic are assigned (and read from their start) within about this long (aiokafka's 300 s
    #: default left them unread for minutes).
    metadata_max_age_ms: int = Field(default=30000, ge=1000, le=3_600_000)
    security: KafkaSecurityConfig = KafkaSecurityConfig()


class RedisConfig(_Section):
    url: str = "redis://127.0.0.1:6390/0"
    #: a Redis Cluster: ``url`` names any one of its nodes (the others are discovered); every
    #: key of a trace, session or expectation shares a hash tag, so each lives in one slot.
    cluster: bool = False
    password_env: str = "TOOLWITNESS_REDIS_PASSWORD"
    #: every key starts with it (lets several deployments or test runs share one Redis).
    key_prefix: str = Field(default="tw", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    #: life of a trace's state after its last change (or after an expectation on it is registered);
    #: also the longest expectation deadline: a later one is clamped to it.
    state_ttl_seconds: int = Field(default=86400, ge=1)
    #: a trace that is complete and whose expectations are decided keeps its state only this
    #: long (late-span revisions); replay then uses the published observations.
    completed_ttl_seconds: int = Field(default=300, ge=1)
    socket_timeout_seconds: float = Field(default=5.0, gt=0)
    #: PEM bundle to verify a rediss:// server with (empty: the system's trust store).
    ssl_ca_file: str = ""

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"must start with redis://, rediss:// or unix://, got {redact_urls(v)!r}")
        if not v.startswith("unix://"):
            parts = urlsplit(v)
            try:
                parts.port  # noqa: B018 -- raises on a port that is not a number in range
            except ValueError:
                raise ValueError(f"the port in {redact_urls(v)!r} is not a number from 0 to 65535") from None
            db = parts.path.strip("/")
            if db and not db.isdigit():
                raise ValueError(f"the database in {redact_urls(v)!r} must be a number (e.g. /0), got {db!r}")
        return v

    @model_validator(mode="after")
    def _cluster_url(self) -> RedisConfig:
        if self.ssl_ca_file and not self.url.startswith("rediss://"):
            raise ValueError("redis.ssl_ca_file is set but redis.url is not rediss:// (TLS)")
        if self.cluster:
            if self.url.startswith("unix://"):
                raise ValueError(
                    "redis.cluster: a Redis Cluster is reached over TCP (redis:// or rediss://), not unix://"
                )
            db = urlsplit(self.url).path.strip("/")
            if db not in ("", "0"):
                raise ValueError(f"redis.cluster: a Redis Cluster has only database 0, the url names database {db!r}")
        return self


class CompletionConfig(_Section):
    #: marker: only completion markers prove absence. inferred: also root end + watermark.
    mode: Literal["marker", "inferred"] = "marker"
    allowed_lateness_ms: int = Field(default=2000, ge=0)
    max_out_of_orderness_ms: int = Field(default=1000, ge=0)
    idle_partition_ms: int = Field(default=10000, ge=0)
    default_deadline_seconds: float = Field(default=300, gt=0)
    sweep_interval_ms: int = Field(default=250, ge=10)


class LimitsConfig(_Section):
    max_spans_per_trace: int = Field(default=10000, ge=1)
    max_attributes_per_span: int = Field(default=1024, ge=1)
    max_tool_executions_per_trace: int = Field(default=1000, ge=1)
    #: arguments longer than this are kept truncated (and judged UNDETERMINED).
    max_argument_bytes: int = Field(default=1024, ge=16)
    #: largest observation record published. A bigger one (many executions with long arguments,
    #: a large session) is judged and published with its arguments cut to fit (TRUNCATED, so
    #: argument conditions are UNDETERMINED), or without its executions (limit_exceeded); the
    #: Kafka producer refuses records over 1 MiB, which would stall the partition for good.
    max_observation_bytes: int = Field(default=900_000, ge=65_536, le=1_000_000)


class ScorerTreeConfig(_Section):
    """A named scorer tree. ``type`` picks the node; wrappers nest ``scorers`` / ``scorer``."""

    type: Literal["otel_tool_call", "substring", "plagiarism", "composite", "inverter", "threshold", "fallback"]
    substring: str | None = None
    case_sensitive: bool = False
    reference_text: str | None = None
    aggregator: Literal["and", "or", "majority"] | None = None
    threshold: float | None = None
    categories: tuple[str, ...] = ()
    scorers: tuple[ScorerTreeConfig, ...] = ()
    scorer: ScorerTreeConfig | None = None
    fallback_scorer: ScorerTreeConfig | None = None

    @model_validator(mode="after")
    def _keys_of_its_type(self) -> ScorerTreeConfig:
        """A key another type takes is a mistake (an otel_tool_call node with ``scorers`` ran as a
        bare tool scorer, its other criteria gone)."""
        fields = type(self).model_fields
        given = {k for k in self.model_fields_set if getattr(self, k) != fields[k].get_default()}  # dumps set all
        misplaced = keys_not_for(self.type, given)
        if misplaced:
            takes = ", ".join(sorted(TREE_KEYS_BY_TYPE[self.type])) or "no other key"
            raise ValueError(f"{misplaced} do(es) not apply to type {self.type!r} (it takes: {takes})")
        return self


class AdminConfig(_Section):
    host: str = "127.0.0.1"
    #: serves /healthz (liveness), /readyz (readiness) and /metrics (Prometheus).
    port: int = Field(default=8888, ge=0, le=65535)


class ServiceConfig(_Section):
    tenant: TenantConfig = TenantConfig()
    kafka: KafkaConfig = KafkaConfig()
    redis: RedisConfig = RedisConfig()
    completion: CompletionConfig = CompletionConfig()
    limits: LimitsConfig = LimitsConfig()
    scorers: dict[str, ScorerTreeConfig] = Field(
        default_factory=lambda: {"tools": ScorerTreeConfig(type="otel_tool_call")}
    )
    admin: AdminConfig = AdminConfig()

    @field_validator("scorers")
    @classmethod
    def _some_tree(cls, v: dict[str, ScorerTreeConfig]) -> dict[str, ScorerTreeConfig]:
        if not v:
            raise ValueError(
                "no scorer tree: every expectation names one, so each would be dead-lettered (unknown_scorer); "
                "name at least one, or leave `scorers:` out for the default `tools` tree"
            )
        return v
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    #: json: one JSON object per line (timestamp, level, logger, message, exception), for log
    #: pipelines that would otherwise split a traceback into one event per line
    log_format: Literal["text", "json"] = "text"
    #: name of this instance in logs and metrics (defaults to host:pid).
    instance: str = ""
    #: dotted config path -> the environment variable that set it (``load_config`` fills it), so
    #: an error found after loading (a scorer tree that does not build) names the variable too
    _env_sources: dict[str, str] = PrivateAttr(default_factory=dict)

    def set_by(self, path: str) -> str:
        """`` (set by VAR)`` / `` (keys in it set by VAR, ...)`` when environment variables set
        ``path`` or keys below it; empty when it came from the file or the defaults alone."""
        return _set_by(self._env_sources, path)


def _set_by(sources: Mapping[str, str], where: str) -> str:
    origin = sources.get(where) or next((v for k, v in sources.items() if where.startswith(k + ".")), None)
    if origin:
        return f" (set by {origin})"
    # a section's or tree's own check (keys that do not go together) fails at the section
    below = sorted(v for k, v in sources.items() if k.startswith(where + "."))
    return f" (keys in it set by {', '.join(below)})" if below else ""


class ConfigError(ValueError):
    """The configuration is invalid; the message names each offending key."""

    retriable = False


ENV_PREFIX = "TOOLWITNESS_"
#: single-underscore names: two documented shorthands and the top-level scalars
_SHORTHANDS = {
    "TOOLWITNESS_KAFKA_BOOTSTRAP": ("kafka", "bootstrap_servers"),
    "TOOLWITNESS_REDIS_URL": ("redis", "url"),
    "TOOLWITNESS_LOG_LEVEL": ("log_level",),
    "TOOLWITNESS_LOG_FORMAT": ("log_format",),
    "TOOLWITNESS_INSTANCE": ("instance",),
}

log = logging.getLogger("toolwitness.config")


def _merged(base: Any, override: Any) -> Any:
    """``override`` on top of ``base``: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = _merged(base.get(k), v)
        return out
    return override


def _set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(path)}: cannot set below non-mapping key {part!r}")
        node = child
    # A mapping (TOOLWITNESS_KAFKA__TOPICS='{"spans": "x"}') overrides the keys it names; the
    # file's others stay (replacing the section would silently bring back their defaults).
    node[path[-1]] = _merged(node.get(path[-1]), value)


def _model_in(ann: Any) -> type[BaseModel] | None:
    """The model ``ann`` names, itself or in ``Model | None`` (None if it names no model)."""
    for t in get_args(ann) if get_origin(ann) in (Union, UnionType) else (ann,):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def _leaf_type(path: tuple[str, ...]) -> Any:
    """The annotation of the config field at ``path`` (None if there is no such field).

    A name in a mapping of named entries (``scorers.<name>``) is stepped over, and a nested
    ``scorer`` / ``fallback_scorer`` walked into, so a tree's text keys are known as text too."""
    ann: Any = ServiceConfig
    parts = list(path)
    while parts:
        part = parts.pop(0)
        if get_origin(ann) is dict:  # ``part`` is the entry's name: its value's type, then its keys
            ann = get_args(ann)[1]
            if not parts:
                return ann
            part = parts.pop(0)
        model = _model_in(ann)
        if model is None or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
    return ann


def _is_text(ann: Any) -> bool:
    return ann is str or (get_origin(ann) in (Union, UnionType) and str in get_args(ann))


def _config_paths(model: type[BaseModel] = ServiceConfig, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_config_paths(ann, (*prefix, name)))
        else:
            out.append((*prefix, name))
    return out


#: a value Kubernetes writes for a Service named ``toolwitness-<x>`` (a service link): such a
#: variable is no misspelt override, even if its name reads like one (TOOLWITNESS_ADMIN_PORT)
_SERVICE_LINK = re.compile(r"^(tcp|udp|sctp)://")


def _sections() -> dict[str, str]:
    """``SECTION`` -> an example ``SECTION__KEY`` for each top-level section set key by key."""
    out: dict[str, str] = {}
    for name, f in ServiceConfig.model_fields.items():
        model = _model_in(f.annotation)
        if model is not None:
            out[name.upper()] = f"{name}__{next(iter(model.model_fields))}".upper()
        elif get_origin(f.annotation) is dict:  # scorers: named entries, then their keys
            out[name.upper()] = f"{name.upper()}__<NAME>__TYPE"
    return out


def _not_read(key: str, raw: str) -> str | None:
    """Why ``key`` looks like a misspelt config override and is not read (None: it is no override).

    Only two shapes: a top-level section on its own (``TOOLWITNESS_KAFKA``) and a config path
    spelt with single underscores (``TOOLWITNESS_KAFKA_GROUP_ID``, ``TOOLWITNESS_LOGLEVEL``). Other
    TOOLWITNESS_* variables (the secrets the config names, TOOLWITNESS_TOOL_INTERCEPT, ...) are not
    config and stay untouched."""
    if not key.startswith(ENV_PREFIX):
        return None
    rest = key[len(ENV_PREFIX) :]
    sections = _sections()
    if rest in sections:
        return (
            f"{key} is not read: the {rest.lower()} section is set one key at a time, "
            f"e.g. {ENV_PREFIX}{sections[rest]} (two underscores between levels)"
        )
    if rest.startswith("SCORERS_"):
        return (
            f"{key} is not read: a scorer tree's keys are set as {ENV_PREFIX}SCORERS__<NAME>__<KEY> "
            "(two underscores between levels)"
        )
    near = {"_".join(p).upper(): "__".join(p).upper() for p in _config_paths() if len(p) > 1}
    if rest in near:
        if _SERVICE_LINK.match(raw):
            log.warning(
                "config: %s is not read (its value looks like a Kubernetes service link; "
                "the config key would be %s%s)", key, ENV_PREFIX, near[rest],
            )
            return None
        return f"{key} is not read (levels are separated by two underscores): did you mean {ENV_PREFIX}{near[rest]}?"
    # a misspelt top-level key (TOOLWITNESS_LOGLEVEL): the same letters without underscores
    squeezed = {k.replace("_", ""): k for k in _SHORTHANDS}
    if key not in _SHORTHANDS and key.replace("_", "") in squeezed:
        return f"{key} is not read: did you mean {squeezed[key.replace('_', '')]}?"
    return None


def _env_overrides(env: Mapping[str, str]) -> list[tuple[tuple[str, ...], Any, str]]:
    """(path, value, variable) for every config override in ``env``.

    ``TOOLWITNESS_<SECTION>__<KEY>`` (double underscores between levels). A value is taken as
    JSON (numbers, booleans, lists, objects) unless the key is a text field, which keeps it
    verbatim (``TOOLWITNESS_KAFKA__GROUP_ID=2024`` is the group "2024", and
    ``TOOLWITNESS_SCORERS__T__SUBSTRING=null`` the substring "null"). A variable that looks like
    a misspelt override (``TOOLWITNESS_KAFKA``, ``TOOLWITNESS_KAFKA_GROUP_ID``) is refused: it
    would silently change nothing."""
    out: list[tuple[tuple[str, ...], Any, str]] = []
    misspelt: list[str] = []
    for key, raw in sorted(env.items()):
        path: tuple[str, ...] | None = None
        if key in _SHORTHANDS:
            path = _SHORTHANDS[key]
        elif key.startswith(ENV_PREFIX) and "__" in key:
            path = tuple(p.lower() for p in key[len(ENV_PREFIX) :].split("__"))
        elif (why := _not_read(key, raw)) is not None:
            misspelt.append(why)
        if path is None:
            continue
        value: Any = raw
        if not _is_text(_leaf_type(path)):
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw
        out.append((path, value, key))
    if misspelt:
        raise ConfigError(f"invalid configuration: {'; '.join(misspelt)}")
    return out


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> ServiceConfig:
    """Load and validate the configuration; raise ConfigError naming every bad key."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = load_yaml(path.read_text())
        except DuplicateKeyError as exc:
            raise ConfigError(f"config {path}: {exc}") from None
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path}: top level must be a mapping, got {type(loaded).__name__}")
        data = loaded or {}
    overrides = _env_overrides(os.environ if env is None else env)
    if "scorers" not in data and any(p[0] == "scorers" for p, _, _ in overrides):
        # A variable adds or changes one tree, as it changes one key of any section: the default
        # trees stay (``tools`` is the scorer ToolwitnessClient.expect names by default).
        defaults = ServiceConfig.model_fields["scorers"].get_default(call_default_factory=True)
        data["scorers"] = {n: t.model_dump(exclude_defaults=True) for n, t in defaults.items()}
    sources: dict[str, str] = {}
    for p, v, var in overrides:
        named = data.get("scorers")
        if len(p) > 1 and p[0] == "scorers" and isinstance(named, dict) and p[1] not in named:
            # environment names are upper case: TOOLWITNESS_SCORERS__MYTOOLS__... means the
            # file's scorer myTools (scorer names keep their case)
            same = [n for n in named if isinstance(n, str) and n.lower() == p[1]]
            if len(same) == 1:
                p = (p[0], same[0], *p[2:])
        _set_path(data, p, v)
        sources[".".join(p)] = var
    try:
        cfg = ServiceConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for e in exc.errors(include_url=False):
            where = ".".join(str(x) for x in e["loc"])
            problems.append(f"{where}: {e['msg']}{_set_by(sources, where)}")
        raise ConfigError(f"invalid configuration: {'; '.join(problems)}") from None
    cfg._env_sources = sources
    return cfg

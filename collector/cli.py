"""The ``toolwitness`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

if TYPE_CHECKING:
    from collector.config import KafkaConfig, ServiceConfig

app = typer.Typer(
    help="toolwitness: streaming, three-valued scoring of what an agent's tools actually did.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks: each prints one table of figures measured in that run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.callback()
def _bench_setup() -> None:
    from collector.telemetry.logs import quiet_retried_coordinator_lookups

    quiet_retried_coordinator_lookups()  # each run makes fresh groups, which wait for a coordinator


def _logging(cfg: ServiceConfig) -> None:
    """Root logging as the config says (level and line format), for a command that runs the
    service or the sidecar: each reads its own config, so each must call this with it."""
    from collector.telemetry.logs import log_formatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(log_formatter(cfg.log_format))
    logging.basicConfig(level=cfg.log_level, handlers=[handler])


ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Service config YAML (env TOOLWITNESS_* overrides)")
]


@app.command()
def run(config: ConfigOpt = None) -> None:
    """Run the streaming scorer: otlp_spans + control → Redis → scores + observations."""
    from collector.config import ConfigError, load_config
    from collector.pipeline.service import ToolwitnessService
    from collector.processors.decide import Decider

    try:
        cfg = load_config(config)
        Decider(cfg)  # every scorer tree builds (as validate-config checks) before anything starts
    except (ConfigError, ValueError) as exc:
        typer.echo(f"toolwitness: {exc}", err=True)
        raise typer.Exit(2) from None
    _logging(cfg)

    async def main() -> None:
        service = ToolwitnessService(cfg, owns_process=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.request_stop)
        try:
            started = await service.start_unless_stopped()
        except Exception as exc:
            with contextlib.suppress(Exception):
                await service.shutdown()
            raise _StartFailed(_start_failure(cfg, exc)) from exc
        if not started:  # SIGTERM while starting: nothing consumed, nothing to commit
            await service.shutdown()
            return
        try:
            await service.run()
        finally:
            await service.shutdown()

    try:
        asyncio.run(main())
    except _StartFailed as exc:
        # One line a platform team can act on; the traceback only at DEBUG.
        logging.getLogger("toolwitness").debug("start failed", exc_info=exc.__cause__)
        typer.echo(f"toolwitness: could not start: {exc}", err=True)
        raise typer.Exit(1) from None


class _StartFailed(Exception):
    pass


def _start_failure(cfg: Any, exc: BaseException) -> str:
    """What failed at start, naming the setting to check."""
    from aiokafka.errors import InvalidSessionTimeoutError, KafkaError
    from redis.exceptions import RedisError

    what = f"{type(exc).__name__}: {exc}".strip()[:300]
    if isinstance(exc, InvalidSessionTimeoutError):  # the brokers answered: not a connection problem
        return (
            f"kafka.session_timeout_ms ({cfg.kafka.session_timeout_ms}) is refused by the brokers: it must lie "
            "within their group.min.session.timeout.ms and group.max.session.timeout.ms (6000 and 1800000 by "
            f"default) ({what})"
        )
    if isinstance(exc, RedisError) or "redis" in type(exc).__module__:
        return f"Redis at redis.url {_redact_urls(cfg.redis.url)!r} ({what})"
    if isinstance(exc, KafkaError) or "kafka" in type(exc).__module__:
        return f"Kafka at kafka.bootstrap_servers {cfg.kafka.bootstrap_servers!r} ({what})"
    if isinstance(exc, OSError) and exc.errno in (98, 13):  # address in use / permission denied
        return f"the admin endpoint {cfg.admin.host}:{cfg.admin.port} (admin.host/admin.port) ({what})"
    if isinstance(exc, TimeoutError):
        return f"a step timed out: check redis.url and kafka.bootstrap_servers are reachable ({what or 'timeout'})"
    return what


@app.command("validate-config")
def validate_config(config: ConfigOpt = None) -> None:
    """Validate a service config (and build every scorer tree); print the effective config."""
    from collector.config import ConfigError, load_config
    from collector.processors.decide import Decider

    try:
        cfg = load_config(config)
        Decider(cfg)
    except (ConfigError, ValueError) as exc:
        typer.echo(f"toolwitness: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(_redact_urls(cfg.model_dump_json(indent=2)))


def _redact_urls(text: str) -> str:
    """Hide credentials embedded in URLs (redis://user:secret@host) before printing."""
    from collector.config import redact_urls

    return redact_urls(text)


@app.command()
def sidecar(
    listen: Annotated[str, typer.Option(help="host:port for OTLP/gRPC")] = "127.0.0.1:4317",
    config: ConfigOpt = None,
    tls_cert: Annotated[str, typer.Option(help="server certificate (PEM) to serve TLS")] = "",
    tls_key: Annotated[str, typer.Option(help="server private key (PEM)")] = "",
    token_env: Annotated[str, typer.Option(help="env var holding the required bearer token")] = (
        "TOOLWITNESS_SIDECAR_TOKEN"
    ),
    tenant: Annotated[
        str,
        typer.Option(help="stamp every forwarded record with this tenant (the tenant.header Kafka header)"),
    ] = "",
    admin_listen: Annotated[
        str,
        typer.Option(help="host:port for /healthz, /readyz and /metrics ('' = none)"),
    ] = "",
    shutdown_delay: Annotated[
        float,
        typer.Option(help="on SIGTERM/SIGINT, seconds to stay up not ready (still forwarding) before stopping "
                          "(0 = stop at once; a second signal ends the wait)"),
    ] = 5.0,
) -> None:
    """OTLP/gRPC TraceService receiver that forwards spans to Kafka keyed by trace id."""
    from collector.config import ConfigError, load_config
    from collector.receivers.otlp_grpc import SidecarConfig, run_sidecar

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        typer.echo(f"toolwitness: {exc}", err=True)
        raise typer.Exit(2) from None
    _logging(cfg)
    try:
        sidecar_cfg = SidecarConfig(
            listen=listen,
            kafka=cfg.kafka,
            bearer_token_env=token_env,
            tls_certfile=tls_cert,
            tls_keyfile=tls_key,
            tenant=tenant,
            tenant_header=cfg.tenant.header,
            admin_listen=admin_listen,
            shutdown_delay_seconds=shutdown_delay,
        )
    except ValidationError as exc:
        typer.echo(f"toolwitness sidecar: {exc.errors(include_url=False)[0]['msg']}", err=True)
        raise typer.Exit(2) from None
    started = False

    def on_started(_: object) -> None:
        nonlocal started
        started = True

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_sidecar(sidecar_cfg, on_started=on_started))
    except Exception as exc:
        if started:
            raise
        # One line naming what failed, as `run` prints; the traceback only at DEBUG.
        logging.getLogger("toolwitness").debug("sidecar start failed", exc_info=exc)
        typer.echo(f"toolwitness sidecar: could not start: {_sidecar_start_failure(sidecar_cfg, exc)}", err=True)
        raise typer.Exit(1) from None


def _sidecar_start_failure(cfg: Any, exc: BaseException) -> str:
    """What failed when the sidecar started, naming the option or setting to check."""
    from aiokafka.errors import KafkaError

    from collector.grpc_server import ListenError

    what = f"{type(exc).__name__}: {exc}".strip()[:300]
    kafka = f"Kafka at kafka.bootstrap_servers {cfg.kafka.bootstrap_servers!r}"
    if isinstance(exc, KafkaError) or "kafka" in type(exc).__module__:
        return f"{kafka} ({what})"
    if isinstance(exc, TimeoutError):  # Kafka is the one thing it waits for before it listens
        return f"{kafka} did not answer within kafka.request_timeout_ms ({cfg.kafka.request_timeout_ms} ms)"
    if isinstance(exc, ListenError):
        return f"{exc} (--listen)"
    if isinstance(exc, OSError) and exc.filename in (cfg.tls_certfile, cfg.tls_keyfile):
        return f"the TLS files --tls-cert / --tls-key ({what})"
    return what


@app.command()
def demo() -> None:
    """End to end on the local Kafka + Redis (`make demo` starts them): the service and a sample
    agent; prints each score."""
    from aiokafka.errors import KafkaError
    from redis.exceptions import RedisError

    from collector.demo import demo_config, run_demo

    try:
        rc = asyncio.run(run_demo())
    except (OSError, TimeoutError, KafkaError, RedisError) as exc:  # Redis or Kafka not there: one line
        typer.echo(f"toolwitness: could not start: {_start_failure(demo_config(), exc)}; "
                   "start them with `make services-up`", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(rc)


FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="keep reading new records until interrupted")]
NewOpt = Annotated[bool, typer.Option("--new", help="only records written from now on (else from the start)")]
LimitOpt = Annotated[int, typer.Option(help="stop after this many records (0: no limit)", min=0)]
JsonLinesOpt = Annotated[bool, typer.Option("--json", help="one JSON object per line instead of a table")]


def _client_command(
    what: str, config: Path | None, run: Callable[[ServiceConfig], Coroutine[Any, Any, object]],
    failures: tuple[type[BaseException], ...],
) -> None:
    """A command that talks to a running deployment: load the config (exit 2 on an error), run
    ``run(cfg)``, and turn one of ``failures`` (or Kafka's, or the network's) into one line and
    exit 1; Ctrl-C ends it with 0."""
    from aiokafka.errors import KafkaError

    from collector.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except (ConfigError, ValueError) as exc:
        typer.echo(f"toolwitness: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        asyncio.run(run(cfg))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except (*failures, KafkaError, OSError) as exc:
        typer.echo(f"toolwitness {what}: {exc}", err=True)
        raise typer.Exit(1) from None


def _tail(what: str, config: Path | None, run: Callable[[KafkaConfig], Coroutine[Any, Any, object]]) -> None:
    """The topic readers: only the config's kafka section (brokers, security, topic names)."""
    from collector.tail import TailError

    _client_command(what, config, lambda cfg: run(cfg.kafka), (TailError,))


@app.command()
def scores(
    config: ConfigOpt = None,
    expectation: Annotated[
        list[str] | None, typer.Option("--expectation", "-e", help="only this expectation id (repeatable)")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's scores")] = None,
    resends: Annotated[bool, typer.Option("--resends", help="also the identical re-sends of a score_id")] = False,
    follow: FollowOpt = False,
    new: NewOpt = False,
    limit: LimitOpt = 0,
    json_out: JsonLinesOpt = False,
) -> None:
    """Print the score events on the scores topic, decoded (protobuf or JSON)."""
    from collector.tail import Tail, show_scores

    tail = Tail(from_beginning=not new, follow=follow, limit=limit)
    _tail("scores", config, lambda k: show_scores(
        k, tail, expectations=set(expectation or ()), tenant=tenant, resends=resends, json_out=json_out))


@app.command()
def observation(
    observation_id: Annotated[str, typer.Argument(help="the id a score event names (observation_ids)")],
    config: ConfigOpt = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for it to appear", min=0.1)] = 15.0,
    json_out: JsonLinesOpt = False,
) -> None:
    """Print one observation (the evidence a score cites) from the observations topic, its
    content checked against its id."""
    from collector.tail import show_observation

    _tail("observation", config, lambda k: show_observation(k, observation_id, timeout_s=timeout, json_out=json_out))


@app.command()
def dlq(
    config: ConfigOpt = None,
    reason: Annotated[str | None, typer.Option(help="only dead letters with this reason")] = None,
    follow: FollowOpt = False,
    new: NewOpt = False,
    limit: LimitOpt = 0,
    json_out: JsonLinesOpt = False,
) -> None:
    """Print the dead letters on the DLQ topic: the source record, the reason and its detail."""
    from collector.tail import Tail, show_dead_letters

    tail = Tail(from_beginning=not new, follow=follow, limit=limit)
    _tail("dlq", config, lambda k: show_dead_letters(k, tail, reason=reason, json_out=json_out))


@app.command()
def smoke(
    config: ConfigOpt = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for each score", min=1)] = 60.0,
    otlp_endpoint: Annotated[
        str, typer.Option(help="host:port of an OTLP/gRPC sidecar to send the spans through (else Kafka directly)")
    ] = "",
    otlp_ca: Annotated[str, typer.Option(help="CA (PEM) of the sidecar's TLS certificate; empty: plaintext")] = "",
    otlp_token_env: Annotated[str, typer.Option(help="env var holding the sidecar's bearer token")] = "",
    tenant: Annotated[
        str, typer.Option(help="tenant of the smoke trace and expectations (a sidecar stamping one needs it)")
    ] = "toolwitness-smoke",
    spans_sasl_username_env: Annotated[
        str, typer.Option(help="env var of a span producer's SASL username, for the spans written to Kafka")
    ] = "",
    spans_sasl_password_env: Annotated[str, typer.Option(help="env var of that span producer's SASL password")] = "",
) -> None:
    """Check a running deployment end to end: an instrumented agent's spans, two expectations,
    TRUE before the completion marker and FALSE after it, the observation read back. Exit 0 or 1."""
    import os

    from collector.smoke import OtlpTarget, SmokeError, run_smoke

    token = os.environ.get(otlp_token_env, "") if otlp_token_env else ""
    if otlp_token_env and not token:
        typer.echo(f"toolwitness smoke: --otlp-token-env {otlp_token_env} is not set", err=True)
        raise typer.Exit(2)
    otlp = OtlpTarget(otlp_endpoint, otlp_ca, token) if otlp_endpoint else None
    if bool(spans_sasl_username_env) != bool(spans_sasl_password_env):
        typer.echo("toolwitness smoke: give --spans-sasl-username-env and --spans-sasl-password-env together", err=True)
        raise typer.Exit(2)
    spans_sasl = (spans_sasl_username_env, spans_sasl_password_env) if spans_sasl_username_env else None
    _client_command(  # ValueError: a credential variable not set
        "smoke: FAILED", config,
        lambda cfg: run_smoke(cfg, timeout_s=timeout, otlp=otlp, tenant=tenant, spans_sasl_env=spans_sasl),
        (SmokeError, TimeoutError, ValueError),
    )


@bench_app.command("scoring")
def bench_scoring(iterations: Annotated[int, typer.Option()] = 20000) -> None:
    """Verdicts/s of the pure scoring core (10-tool trace, 5-leaf tree)."""
    from scoring import bench

    bench.main([str(iterations)])


JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


@bench_app.command("pipeline")
def bench_pipeline(
    spans: Annotated[int, typer.Option(help="spans to push through")] = 50000,
    rate: Annotated[int, typer.Option(help="target spans/s for the latency run")] = 5000,
    json_out: JsonOpt = False,
    instances: Annotated[str, typer.Option(help="service process counts to compare, e.g. 1,2 ('' = skip)")] = "1,2",
    profile: Annotated[
        Path | None, typer.Option(help="write a pyinstrument profile of the end-to-end pass here (text)")
    ] = None,
) -> None:
    """Spans/s end to end vs the aiokafka floor (1 and 2 instances), time to verdict, Redis bytes per trace."""
    from collector.bench import run_pipeline_bench

    try:
        counts = [int(x) for x in instances.split(",") if x.strip()]
    except ValueError:
        why = f"{instances!r}: comma-separated whole numbers, e.g. 1,2"
        raise typer.BadParameter(why, param_hint="--instances") from None
    raise typer.Exit(
        asyncio.run(
            run_pipeline_bench(
                spans=spans, rate=rate, as_json=json_out, instances=counts, profile=str(profile) if profile else None
            )
        )
    )


@bench_app.command("verdict-latency")
def bench_verdict_latency(
    rates: Annotated[str, typer.Option(help="loads in spans/s, comma-separated")] = "1000,2500,5000",
    seconds: Annotated[float, typer.Option(help="paced sending time per load")] = 10.0,
    json_out: JsonOpt = False,
) -> None:
    """Time from the deciding record produced to the score readable: p50/p95/p99 at several loads."""
    from collector.benches.latency import run_verdict_latency_bench

    loads = [int(x) for x in rates.split(",") if x.strip()]
    raise typer.Exit(asyncio.run(run_verdict_latency_bench(rates=loads, seconds=seconds, as_json=json_out)))


@bench_app.command("state")
def bench_state(
    max_traces: Annotated[int, typer.Option(help="active traces at the last step (full issue size: 100000)")] = 20000,
    max_expectations: Annotated[
        int, typer.Option(help="active expectations at the last step (full issue size: 100000)")
    ] = 10000,
    json_out: JsonOpt = False,
) -> None:
    """Redis bytes per active trace and per tool execution; growth with active traces and expectations."""
    from collector.benches.state import run_state_bench

    raise typer.Exit(asyncio.run(run_state_bench(traces=max_traces, expectations=max_expectations, as_json=json_out)))


@bench_app.command("growth")
def bench_growth(
    spans: Annotated[int, typer.Option(help="spans per step")] = 20000,
    sizes: Annotated[str, typer.Option(help="spans per trace, comma-separated")] = "5,25,100,500",
    max_expectations: Annotated[
        int, typer.Option(help="active expectations at the last step (full issue size: 100000)")
    ] = 10000,
    record_spans: Annotated[int, typer.Option(help="at most this many spans per Kafka record")] = 50,
    json_out: JsonOpt = False,
) -> None:
    """Spans/s as trace size (5 → 500 spans) and active expectations (10 → 10k/100k) grow."""
    from collector.benches.growth import run_growth_bench

    raise typer.Exit(
        asyncio.run(
            run_growth_bench(
                spans=spans,
                sizes=[int(x) for x in sizes.split(",") if x.strip()],
                max_expectations=max_expectations,
                record_spans=record_spans,
                as_json=json_out,
            )
        )
    )


@bench_app.command("vs-tailsampling")
def bench_vs_tailsampling(
    spans: Annotated[int, typer.Option(help="spans in the backlog both drain")] = 50000,
    rate: Annotated[int, typer.Option(help="paced load for the time to decision, spans/s")] = 5000,
    seconds: Annotated[float, typer.Option(help="paced sending time")] = 10.0,
    decision_wait: Annotated[str, typer.Option(help="the Collector's tail_sampling decision_wait")] = "30s",
    json_out: JsonOpt = False,
) -> None:
    """Build (cached) a kafkareceiver + tail_sampling Collector; compare spans/s, time to decision, memory/trace."""
    from collector.benches.tailsampling import run_vs_tailsampling_bench

    raise typer.Exit(
        asyncio.run(
            run_vs_tailsampling_bench(
                spans=spans, rate=rate, latency_seconds=seconds, decision_wait=decision_wait, as_json=json_out
            )
        )
    )


@bench_app.command("all")
def bench_all(json_out: JsonOpt = False) -> None:
    """Every suite in turn at its default size (pipeline, verdict-latency, state, growth, vs-tailsampling)."""
    from collector.benches.suite import run_all

    raise typer.Exit(asyncio.run(run_all(as_json=json_out)))


def _mount_eval() -> None:
    try:
        from scoring.evaluation.command import eval_command
    except ImportError:  # pragma: no cover - evaluation package not installed
        return
    app.command("eval", help="Evaluate scorer configurations against human-labeled datasets.")(eval_command)


_mount_eval()


if __name__ == "__main__":  # `python -m collector.cli ...`, as the `toolwitness` script
    app()

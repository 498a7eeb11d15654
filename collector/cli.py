"""The ``toolwitness`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="toolwitness: streaming, three-valued scoring of what an agent's tools actually did.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks: each prints one table of figures measured in that run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Service config YAML (env TOOLWITNESS_* overrides)")
]


@app.command()
def run(config: ConfigOpt = None) -> None:
    """Run the streaming scorer: otlp_spans + control → Redis → scores + observations."""
    from collector.config import ConfigError, load_config
    from collector.pipeline.service import ToolwitnessService

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        typer.echo(f"toolwitness: {exc}", err=True)
        raise typer.Exit(2) from None
    _logging(cfg.log_level)

    async def main() -> None:
        service = ToolwitnessService(cfg)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.request_stop)
        await service.start()
        try:
            await service.run()
        finally:
            await service.shutdown()

    asyncio.run(main())


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
    typer.echo(cfg.model_dump_json(indent=2))


@app.command()
def sidecar(
    listen: Annotated[str, typer.Option(help="host:port for OTLP/gRPC")] = "127.0.0.1:4317",
    config: ConfigOpt = None,
) -> None:
    """OTLP/gRPC TraceService receiver that forwards spans to Kafka keyed by trace id."""
    from collector.config import load_config
    from collector.receivers.otlp_grpc import SidecarConfig, run_sidecar

    cfg = load_config(config)
    _logging(cfg.log_level)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_sidecar(SidecarConfig(listen=listen, kafka=cfg.kafka)))


@app.command()
def demo(
    keep_services: Annotated[bool, typer.Option(help="leave Kafka and Redis running afterwards")] = True,
) -> None:
    """End to end: local Kafka + Redis, the service, and a sample agent; prints each score."""
    from collector.demo import run_demo

    raise typer.Exit(asyncio.run(run_demo(keep_services=keep_services)))


@bench_app.command("scoring")
def bench_scoring(iterations: Annotated[int, typer.Option()] = 20000) -> None:
    """Verdicts/s of the pure scoring core (10-tool trace, 5-leaf tree)."""
    from scoring import bench

    bench.main([str(iterations)])


@bench_app.command("pipeline")
def bench_pipeline(
    spans: Annotated[int, typer.Option(help="spans to push through")] = 50000,
    rate: Annotated[int, typer.Option(help="target spans/s for the latency run")] = 5000,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Spans/s end to end vs the aiokafka floor, time-to-verdict p50/p99, Redis bytes per trace."""
    from collector.bench import run_pipeline_bench

    raise typer.Exit(asyncio.run(run_pipeline_bench(spans=spans, rate=rate, as_json=json_out)))


def _mount_eval() -> None:
    try:
        from scoring.evaluation.command import eval_command
    except ImportError:  # pragma: no cover - evaluation package not installed
        return
    app.command("eval", help="Evaluate scorer configurations against human-labeled datasets.")(eval_command)


_mount_eval()

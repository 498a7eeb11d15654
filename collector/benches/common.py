"""What every ``toolwitness bench`` suite shares: its output (one table or ``--json``), targets,
progress bars, and the CPU accounting that says what bounded a figure.

Every figure a suite prints is measured in that run; where the machine is noisy (a shared
2-core box) the suites print ratios of figures taken in the same run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = [
    "CpuMeter",
    "Target",
    "consoles",
    "emit",
    "finite",
    "listening_pid",
    "new_progress",
    "percentiles",
    "proc_cpu_seconds",
    "proc_rss_bytes",
    "target_rows",
]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class Target:
    """One acceptance target of a suite: met, or not, with the measured value beside it."""

    name: str
    target: str
    value: str
    met: bool


def finite(node: Any) -> Any:
    """NaN/inf (nothing measured) as JSON null, recursively."""
    if isinstance(node, float) and not math.isfinite(node):
        return None
    if isinstance(node, dict):
        return {k: finite(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [finite(v) for v in node]
    return node


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ascending values."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max of ``values`` (ms), nearest rank."""
    v = sorted(values)
    return {
        "p50_ms": percentile(v, 50),
        "p95_ms": percentile(v, 95),
        "p99_ms": percentile(v, 99),
        "max_ms": v[-1] if v else math.nan,
    }


def consoles() -> tuple[Console, Console]:
    """(stdout, stderr) consoles; piped stdout gets a wide table instead of 80 columns."""
    out = Console()
    if not out.is_terminal:
        out = Console(width=170)
    return out, Console(stderr=True)


def new_progress(err: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


def task(progress: Progress, desc: str, n: int) -> tuple[TaskID, Callable[[int], None]]:
    """A progress task and its ``advance(k)``."""
    tid = progress.add_task(desc, total=n)
    return tid, lambda m: progress.advance(tid, m)


def target_rows(t: Table, targets: Sequence[Target]) -> None:
    if not targets:
        return
    t.add_section()
    for tg in targets:
        t.add_row(
            f"target: {tg.name}", "[green]met[/]" if tg.met else "[red]MISSED[/]", f"{tg.value} (target {tg.target})"
        )


def emit(report: dict[str, Any], targets: Sequence[Target], table: Table | None, as_json: bool, out: Console) -> int:
    """Print the report (table or JSON); exit code 0 every target met, 1 one missed."""
    report["targets"] = [asdict(t) for t in targets]
    report["all_met"] = all(t.met for t in targets)
    if as_json:
        print(json.dumps(finite(report), indent=2))
    elif table is not None:
        out.print(table)
        missed = [t.name for t in targets if not t.met]
        if targets:
            out.print("all targets met" if not missed else f"targets MISSED: {', '.join(missed)}")
    return 0 if report["all_met"] else 1


# --------------------------------------------------------------------------------------------------
# CPU and memory of processes (Linux /proc): what bounded a figure
# --------------------------------------------------------------------------------------------------


def proc_cpu_seconds(pid: int | None) -> float:
    """user + system CPU seconds of ``pid`` (its threads included); NaN if unreadable."""
    if pid is None:
        return math.nan
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return math.nan
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


def proc_rss_bytes(pid: int) -> int:
    """VmRSS of ``pid`` in bytes (0 if unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(parts[9])
    return inodes


def listening_pid(port: int) -> int | None:
    """The pid of the local process listening on TCP ``port`` (None if not found or not ours to see)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in wanted:
                        return int(proc.name)
    return None


def _port(address: str, default: int) -> int:
    tail = address.split(",")[0].rsplit(":", 1)
    try:
        return int(tail[1].split("/")[0]) if len(tail) == 2 else default
    except ValueError:
        return default


class CpuMeter:
    """CPU seconds used by the bench process, its child processes, Redis and Kafka over a window.

    Redis and Kafka are found by the local port they listen on (the servers this machine runs);
    a server elsewhere is simply not counted (NaN).
    """

    def __init__(self, kafka_bootstrap: str, redis_url: str) -> None:
        self.pids: dict[str, int | None] = {
            "kafka": listening_pid(_port(kafka_bootstrap, 9092)),
            "redis": listening_pid(_port(redis_url.split("@")[-1].split("//")[-1], 6379)),
        }
        self.children: dict[str, int] = {}
        self._t0 = 0.0
        self._start: dict[str, float] = {}

    def add_child(self, name: str, pid: int) -> None:
        self.children[name] = pid

    def _now(self) -> dict[str, float]:
        out = {"bench": time.process_time()}
        for name, pid in (*self.pids.items(), *self.children.items()):
            out[name] = proc_cpu_seconds(pid)
        return out

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._start = self._now()

    def stop(self) -> dict[str, Any]:
        """{"seconds": wall, "cpu_s": {name: seconds}, "busy": {name: share of one core}, "cores_busy": total}."""
        wall = time.perf_counter() - self._t0
        end = self._now()
        cpu = {k: end[k] - self._start.get(k, math.nan) for k in end}
        busy = {k: (v / wall if wall > 0 else math.nan) for k, v in cpu.items()}
        total = sum(v for v in busy.values() if math.isfinite(v))
        return {"seconds": wall, "cpu_s": cpu, "busy": busy, "cores_busy": total, "cores": os.cpu_count() or 0}

    @contextlib.contextmanager
    def window(self, into: dict[str, Any]) -> Iterator[None]:
        self.start()
        try:
            yield
        finally:
            into.update(self.stop())


def busy_text(cpu: dict[str, Any]) -> str:
    """'bench 0.98, redis 0.31, kafka 0.22 = 1.51 of 2 cores' (shares of one core)."""
    parts = ", ".join(f"{k} {v:.2f}" for k, v in cpu.get("busy", {}).items() if math.isfinite(v))
    return f"{parts} = {cpu.get('cores_busy', math.nan):.2f} of {cpu.get('cores', 0)} cores"

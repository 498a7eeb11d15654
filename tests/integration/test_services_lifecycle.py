"""scripts/services.py keeps its promises: `up` is idempotent, `down` leaves nothing of ours.

The first test re-runs `up` on the instance the other integration tests use (started by
`make services-up` / `make test`) and checks nothing changed. The second starts a SECOND,
isolated instance (own state dir, own free ports), runs up, up, status, down, and checks that
every pid it recorded is gone and every port closed, while the main instance stays untouched.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "services.py"
MAIN_STATE_DIR = Path(os.environ.get("TOOLWITNESS_SERVICES_STATE_DIR") or ROOT / ".cache" / "services")
SERVICES = ("redis", "kafka")


def services(*args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        check=False,
    )


def recorded(state_dir: Path) -> dict[str, dict[str, object]]:
    """service -> the JSON record `up` wrote (pid, starttime, ports, ...)."""
    out: dict[str, dict[str, object]] = {}
    for service in SERVICES:
        meta = state_dir / service / f"{service}.json"
        if meta.exists():
            out[service] = json.loads(meta.read_text())
    return out


def running(pid: int) -> bool:
    """os.kill(pid, 0) succeeds, and the process is not merely an unreaped zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def pid_of(record: dict[str, object]) -> int:
    pid = record["pid"]
    assert isinstance(pid, int)
    return pid


def test_up_again_keeps_the_running_instance(kafka_bootstrap: str, redis_url: str) -> None:
    before = recorded(MAIN_STATE_DIR)
    assert set(before) == set(SERVICES), (
        f"no running instance recorded in {MAIN_STATE_DIR}: run `make services-up` first"
    )

    proc = services("up")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "redis: already running" in proc.stdout
    assert "kafka: already running" in proc.stdout
    assert "KAFKA_BOOTSTRAP=127.0.0.1:" in proc.stdout

    after = recorded(MAIN_STATE_DIR)
    assert {s: pid_of(r) for s, r in after.items()} == {s: pid_of(r) for s, r in before.items()}
    assert all(running(pid_of(r)) for r in after.values())

    status = services("status")
    assert status.returncode == 0, status.stdout + status.stderr
    for service, record in after.items():
        line = next(ln for ln in status.stdout.splitlines() if ln.startswith(service))
        assert str(pid_of(record)) in line and line.rstrip().endswith("alive"), status.stdout


@pytest.mark.slow
def test_isolated_instance_up_twice_then_down_leaves_nothing(tmp_path: Path) -> None:
    main_before = recorded(MAIN_STATE_DIR)
    redis_port, kafka_port, controller_port = free_ports(3)
    state_dir = tmp_path / "services"
    flags = [
        f"--state-dir={state_dir}",
        f"--redis-port={redis_port}",
        f"--kafka-port={kafka_port}",
        f"--controller-port={controller_port}",
        "--timeout=90",
    ]
    try:
        first = services("up", *flags)
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"KAFKA_BOOTSTRAP=127.0.0.1:{kafka_port}" in first.stdout
        assert f"REDIS_URL=redis://127.0.0.1:{redis_port}/0" in first.stdout
        started = recorded(state_dir)
        assert set(started) == set(SERVICES)
        pids = {s: pid_of(r) for s, r in started.items()}
        assert all(running(pid) for pid in pids.values())
        assert all(port_open(p) for p in (redis_port, kafka_port, controller_port))

        second = services("up", *flags)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "redis: already running" in second.stdout and "kafka: already running" in second.stdout
        assert {s: pid_of(r) for s, r in recorded(state_dir).items()} == pids

        status = services("status", *flags)
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        down = services("down", *flags)
    assert down.returncode == 0, down.stdout + down.stderr

    for service, pid in pids.items():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert not (state_dir / service / f"{service}.pid").exists()
        assert not (state_dir / service / f"{service}.json").exists()
    assert not any(port_open(p) for p in (redis_port, kafka_port, controller_port))

    after_down = services("status", *flags)
    assert after_down.returncode != 0 and "not started" in after_down.stdout

    # The main instance the other tests use was not disturbed.
    main_after = recorded(MAIN_STATE_DIR)
    assert {s: pid_of(r) for s, r in main_after.items()} == {s: pid_of(r) for s, r in main_before.items()}
    assert all(running(pid_of(r)) for r in main_after.values())

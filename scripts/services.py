#!/usr/bin/env python3
"""Start, stop and inspect the local Redis and Kafka (KRaft) that the integration tests use.

    python scripts/services.py up      [--keep-data] [--only redis|kafka] [--state-dir DIR] [--kafka-port N] ...
    python scripts/services.py down    [--only redis|kafka] [--state-dir DIR]
    python scripts/services.py status  [--state-dir DIR]

Standard library only, so it runs with any Python >= 3.11 (the Makefile uses .venv/bin/python).

* Redis: ``redis-server`` from PATH; when missing, Debian's package is installed with apt-get.
* Kafka: a real Apache Kafka broker, single node, ``process.roles=broker,controller``. Its jars
  are resolved from Maven Central with Maven (``scripts/kafka-pom.xml``) into ``.cache/kafka``,
  through a project-local Maven repository ``.cache/m2``; once complete a marker file makes
  every later ``up`` skip Maven entirely.

Every process is started by this script, its pid (and kernel start time, to be safe against
pid reuse) recorded under the state dir, and ``down`` stops exactly those pids: SIGTERM, wait,
then SIGKILL. Nothing is ever looked up or killed by process name.

``up`` is idempotent: a service whose recorded pid is alive and whose port answers is left
alone. A service that is not running gets a fresh, empty data dir unless ``--keep-data``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------
# Pinned versions: the ONE place to change them.
#
# Kafka 4.4.0 (newest 4.x served by Maven Central at the time of writing). Chosen after
# checking empirically that aiokafka 0.14.0 works against it, including the idempotent
# producer and transactions (commit + abort, read_committed vs read_uncommitted), see
# tests/integration/test_foundation_kafka_redis.py. Kafka 4.0 removed old protocol versions
# (KIP-896); aiokafka 0.14.0 negotiates versions the 4.x broker still serves. If a future
# aiokafka/Kafka pair breaks, 3.9.x is the fallback (it also needs the log binding changed:
# 3.9 logs through reload4j, i.e. org.slf4j:slf4j-reload4j instead of log4j-slf4j-impl).
#
# KAFKA_LOG4J2_VERSION is the version of log4j-core that kafka_2.13:KAFKA_VERSION pulls in;
# the slf4j->log4j2 binding must match it (see scripts/kafka-pom.xml).
KAFKA_VERSION = "4.4.0"
KAFKA_LOG4J2_VERSION = "2.25.5"
# --------------------------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache"
DEFAULT_STATE_DIR = CACHE_DIR / "services"
KAFKA_POM = REPO_ROOT / "scripts" / "kafka-pom.xml"
MAVEN_REPO = CACHE_DIR / "m2"
KAFKA_HOME = CACHE_DIR / "kafka" / KAFKA_VERSION
KAFKA_LIBS = KAFKA_HOME / "libs"
LIBS_MARKER = ".complete"

HOST = "127.0.0.1"
DEFAULT_REDIS_PORT = 6390
DEFAULT_KAFKA_PORT = 19092
DEFAULT_CONTROLLER_PORT = 19093
DEFAULT_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

KAFKA_HEAP = ["-Xms256m", "-Xmx512m"]
KAFKA_MAIN = "kafka.Kafka"
KAFKA_STORAGE_TOOL = "kafka.tools.StorageTool"


class ServiceError(RuntimeError):
    """A service could not be installed, started or stopped; the message says why."""


def log(msg: str) -> None:
    print(f"[services] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    state_dir: Path
    redis_port: int
    kafka_port: int
    controller_port: int
    timeout_s: float
    keep_data: bool
    #: the services `up` / `down` act on (default both; e.g. restart only Redis in a fault test)
    only: tuple[str, ...] = ("redis", "kafka")

    @property
    def redis_dir(self) -> Path:
        return self.state_dir / "redis"

    @property
    def kafka_dir(self) -> Path:
        return self.state_dir / "kafka"

    @property
    def kafka_bootstrap(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis_port}/0"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ServiceError(f"{name}={raw!r} is not an integer") from exc


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ServiceError(f"{name}={raw!r} is not a number") from exc


# --------------------------------------------------------------------------------------------
# Process bookkeeping
# --------------------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a pid, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after it.
    rest = raw[raw.rfind(")") + 2 :].split()
    return rest[0], int(rest[19])


def pid_alive(pid: int, starttime: int | None = None) -> bool:
    """True if pid runs (a zombie counts as dead) and, if given, started at `starttime`."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return False
    state, started = stat
    if state in ("Z", "X"):
        return False
    return starttime is None or started == starttime


@dataclass(frozen=True)
class Record:
    """What `up` recorded about a process it started."""

    service: str
    pid: int
    starttime: int
    ports: dict[str, int]
    argv: list[str]
    started_at: float

    def alive(self) -> bool:
        return pid_alive(self.pid, self.starttime)

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "pid": self.pid,
            "starttime": self.starttime,
            "ports": self.ports,
            "argv": self.argv,
            "started_at": self.started_at,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Record:
        return Record(
            service=str(data["service"]),
            pid=int(data["pid"]),
            starttime=int(data["starttime"]),
            ports={str(k): int(v) for k, v in dict(data["ports"]).items()},
            argv=[str(a) for a in data["argv"]],
            started_at=float(data["started_at"]),
        )


def _record_paths(service_dir: Path, service: str) -> tuple[Path, Path]:
    return service_dir / f"{service}.pid", service_dir / f"{service}.json"


def read_record(service_dir: Path, service: str) -> Record | None:
    pid_file, meta_file = _record_paths(service_dir, service)
    if meta_file.exists():
        try:
            return Record.from_json(json.loads(meta_file.read_text()))
        except (ValueError, KeyError, TypeError):
            log(f"{service}: ignoring unreadable {meta_file}")
    if pid_file.exists():
        # A pid file without its metadata (should not happen): trust it only with a start time.
        log(f"{service}: {pid_file} has no matching {meta_file.name}; not trusting it")
    return None


def write_record(service_dir: Path, rec: Record) -> None:
    pid_file, meta_file = _record_paths(service_dir, rec.service)
    tmp = meta_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rec.to_json(), indent=2) + "\n")
    tmp.replace(meta_file)
    pid_file.write_text(f"{rec.pid}\n")


def remove_record(service_dir: Path, service: str) -> None:
    for path in _record_paths(service_dir, service):
        path.unlink(missing_ok=True)


def spawn(argv: list[str], cwd: Path, out_file: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start argv detached from our session (it outlives this script), output to out_file."""
    with out_file.open("ab") as out:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )


def record_for(service: str, proc: subprocess.Popen[bytes], ports: dict[str, int], argv: list[str]) -> Record:
    stat = _proc_stat(proc.pid)
    if stat is None:
        raise ServiceError(f"{service}: process {proc.pid} vanished right after start")
    return Record(service, proc.pid, stat[1], ports, argv, time.time())


def stop_pid(service: str, pid: int, starttime: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the exact process we recorded, wait, then SIGKILL; no-op if it is already gone."""
    if not pid_alive(pid, starttime):
        return
    log(f"{service}: stopping pid {pid} (SIGTERM)")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid, starttime):
            _await_reaped(pid)
            return
        time.sleep(0.1)
    log(f"{service}: pid {pid} still alive after {timeout_s:.0f}s, sending SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid, starttime):
            _await_reaped(pid)
            return
        time.sleep(0.1)
    raise ServiceError(f"{service}: pid {pid} survived SIGKILL")


def _await_reaped(pid: int, timeout_s: float = 5.0) -> None:
    """After death, give the adopting parent (init) a moment to collect the zombie, so that
    the pid really disappears (os.kill(pid, 0) raises) by the time `down` returns."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not Path(f"/proc/{pid}").exists():
            return
        stat = _proc_stat(pid)
        if stat is not None and stat[0] not in ("Z", "X"):
            return  # the pid was reused by an unrelated process: not ours to wait for
        time.sleep(0.05)


def _reap(pid: int) -> None:
    """Collect the exit status if pid is our own child (no-op otherwise)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def port_open(port: int, host: str = HOST, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no {path})"
    tail = text.splitlines()[-lines:]
    return f"--- last {len(tail)} lines of {path} ---\n" + "\n".join(tail)


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """Serialise concurrent up/down on one state dir."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / ".lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run(argv: list[str], what: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """Run a setup command to completion; on failure raise with its output."""
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip().splitlines()[-40:]
        raise ServiceError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n" + "\n".join(out))


# --------------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------------


def ensure_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/local/bin/redis-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    if not shutil.which("apt-get"):
        raise ServiceError("redis-server is not on PATH and apt-get is not available to install it")
    log("redis-server not found: installing Debian's package redis-server (apt-get)")
    prefix: list[str] = []
    if os.geteuid() != 0:
        if not shutil.which("sudo"):
            raise ServiceError("redis-server is missing; need root or sudo to apt-get install it")
        prefix = ["sudo", "-n", "env", "DEBIAN_FRONTEND=noninteractive"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Keep the package's postinst from starting a system-wide redis on 6379: we run our own.
    # policy-rc.d is the Debian-documented switch; only created (and removed) if absent.
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = False
    if os.geteuid() == 0 and not policy.exists():
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        made_policy = True
    try:
        lock_wait = ["-o", "DPkg::Lock::Timeout=300"]
        run([*prefix, "apt-get", *lock_wait, "update", "-q"], "apt-get update", env=env)
        run(
            [
                *prefix,
                "apt-get",
                *lock_wait,
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "redis-server",
            ],
            "apt-get install redis-server",
            env=env,
        )
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )
    if not found:
        raise ServiceError("apt-get install redis-server succeeded but redis-server is still not found")
    return found


def redis_ping(port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith(b"+PONG")


def redis_up(cfg: Config) -> Record:
    d = cfg.redis_dir
    d.mkdir(parents=True, exist_ok=True)
    rec = read_record(d, "redis")
    if rec is not None and rec.alive():
        wait_until(lambda: redis_ping(rec.ports["redis"]), cfg.timeout_s, "redis", d / "redis.log", rec.pid)
        log(f"redis: already running (pid {rec.pid}, port {rec.ports['redis']})")
        return rec
    if rec is not None:
        log(f"redis: recorded pid {rec.pid} is gone; starting afresh")
        remove_record(d, "redis")

    server = ensure_redis_server()
    if port_open(cfg.redis_port):
        raise ServiceError(
            f"redis: port {HOST}:{cfg.redis_port} is already taken by a process this script did not "
            "start; stop it or set TOOLWITNESS_SERVICES_REDIS_PORT / --redis-port"
        )
    data = d / "data"
    if not cfg.keep_data and data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True, exist_ok=True)
    logfile = d / "redis.log"
    logfile.write_text("")
    argv = [
        server,
        "--bind",
        HOST,
        "--port",
        str(cfg.redis_port),
        "--protected-mode",
        "yes",
        "--dir",
        str(data),
        "--appendonly",
        "yes",
        "--save",
        "",
        "--daemonize",
        "no",
        "--logfile",
        str(logfile),
        "--databases",
        "16",
    ]
    proc = spawn(argv, cwd=d, out_file=d / "redis.out")
    rec = record_for("redis", proc, {"redis": cfg.redis_port}, argv)
    write_record(d, rec)
    log(f"redis: started pid {proc.pid} on {HOST}:{cfg.redis_port}")
    try:
        wait_until(lambda: redis_ping(cfg.redis_port), cfg.timeout_s, "redis", logfile, proc.pid, proc)
    except ServiceError:
        stop_pid("redis", rec.pid, rec.starttime, timeout_s=5)
        remove_record(d, "redis")
        raise
    return rec


# --------------------------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------------------------


def libs_fingerprint() -> str:
    h = hashlib.sha256()
    h.update(KAFKA_POM.read_bytes())
    h.update(f"{KAFKA_VERSION}|{KAFKA_LOG4J2_VERSION}".encode())
    return h.hexdigest()


def ensure_kafka_libs() -> Path:
    """Resolve the broker's jars with Maven once; later calls only check the marker file."""
    marker = KAFKA_LIBS / LIBS_MARKER
    fingerprint = libs_fingerprint()
    if marker.exists() and marker.read_text().strip() == fingerprint:
        return KAFKA_LIBS
    KAFKA_HOME.mkdir(parents=True, exist_ok=True)
    with (KAFKA_HOME / ".lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        if marker.exists() and marker.read_text().strip() == fingerprint:
            return KAFKA_LIBS
        mvn = shutil.which("mvn")
        if not mvn:
            raise ServiceError("mvn (Apache Maven) is not on PATH; it is needed once to fetch Kafka's jars")
        tmp = KAFKA_HOME / "libs.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        log(f"kafka: resolving Apache Kafka {KAFKA_VERSION} jars with Maven (first run only)")
        t0 = time.monotonic()
        run(
            [
                mvn,
                "-B",
                "-q",
                "-f",
                str(KAFKA_POM),
                f"-Dmaven.repo.local={MAVEN_REPO}",
                f"-Dkafka.version={KAFKA_VERSION}",
                f"-Dlog4j2.version={KAFKA_LOG4J2_VERSION}",
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={tmp}",
            ],
            "mvn dependency:copy-dependencies",
            cwd=REPO_ROOT,
        )
        jars = sorted(p.name for p in tmp.glob("*.jar"))
        if not any(name.startswith(f"kafka_2.13-{KAFKA_VERSION}") for name in jars):
            raise ServiceError(f"Maven finished but {tmp} has no kafka_2.13-{KAFKA_VERSION}.jar")
        if KAFKA_LIBS.exists():
            shutil.rmtree(KAFKA_LIBS)
        tmp.rename(KAFKA_LIBS)
        marker.write_text(fingerprint + "\n")
        log(f"kafka: {len(jars)} jars in {KAFKA_LIBS} ({time.monotonic() - t0:.1f}s)")
    return KAFKA_LIBS


def java_bin() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK):
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise ServiceError("java is not on PATH (Kafka needs Java 17+)")
    return found


def new_cluster_id() -> str:
    """A Kafka Uuid string: 16 random bytes, base64url without padding, not starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def kafka_properties(cfg: Config, data: Path) -> str:
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{cfg.controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{cfg.kafka_port},CONTROLLER://{HOST}:{cfg.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{cfg.kafka_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "4",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        # 50 partitions by default: creating them on first use costs seconds on a small machine.
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "log.retention.hours": "24",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


LOG4J2_PROPERTIES = """\
# Written by scripts/services.py: the broker logs to files under the state dir.
status = warn
name = toolwitness-kafka
appender.server.type = File
appender.server.name = server
appender.server.fileName = ${sys:kafka.logs.dir}/server.log
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.server.ref = server
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.zk.name = org.apache.zookeeper
logger.zk.level = WARN
"""


def kafka_up(cfg: Config) -> Record:
    d = cfg.kafka_dir
    d.mkdir(parents=True, exist_ok=True)
    logs = d / "logs"
    server_log = logs / "server.log"
    rec = read_record(d, "kafka")
    if rec is not None and rec.alive():
        port = rec.ports["kafka"]
        wait_until(lambda: kafka_ready(port), cfg.timeout_s, "kafka", server_log, rec.pid)
        log(f"kafka: already running (pid {rec.pid}, port {port})")
        return rec
    if rec is not None:
        log(f"kafka: recorded pid {rec.pid} is gone; starting afresh")
        remove_record(d, "kafka")

    for port in (cfg.kafka_port, cfg.controller_port):
        if port_open(port):
            raise ServiceError(
                f"kafka: port {HOST}:{port} is already taken by a process this script did not start; "
                "stop it or set TOOLWITNESS_SERVICES_KAFKA_PORT / --kafka-port / --controller-port"
            )
    libs = ensure_kafka_libs()
    java = java_bin()

    data = d / "data"
    cluster_file = d / "cluster.id"
    if not cfg.keep_data:
        if data.exists():
            shutil.rmtree(data)
        cluster_file.unlink(missing_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    if logs.exists() and not cfg.keep_data:
        shutil.rmtree(logs)
    logs.mkdir(parents=True, exist_ok=True)

    props = d / "server.properties"
    props.write_text(kafka_properties(cfg, data))
    log4j = d / "log4j2.properties"
    log4j.write_text(LOG4J2_PROPERTIES)
    if not cluster_file.exists():
        cluster_file.write_text(new_cluster_id() + "\n")
    cluster_id = cluster_file.read_text().strip()

    classpath = f"{libs}/*"
    jvm = [
        java,
        *KAFKA_HEAP,
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dkafka.logs.dir={logs}",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        classpath,
    ]
    t0 = time.monotonic()
    run(
        [*jvm, KAFKA_STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(props), "--ignore-formatted"],
        "kafka storage format",
        cwd=d,
    )
    log(f"kafka: storage formatted (cluster id {cluster_id}, {time.monotonic() - t0:.1f}s)")

    argv = [*jvm, KAFKA_MAIN, str(props)]
    proc = spawn(argv, cwd=d, out_file=logs / "kafka.out")
    rec = record_for("kafka", proc, {"kafka": cfg.kafka_port, "controller": cfg.controller_port}, argv)
    write_record(d, rec)
    log(f"kafka: started pid {proc.pid} (bootstrap {cfg.kafka_bootstrap}); waiting for the broker")
    try:
        wait_until(lambda: kafka_ready(cfg.kafka_port), cfg.timeout_s, "kafka", server_log, proc.pid, proc)
    except ServiceError as exc:
        out = log_tail(logs / "kafka.out", 20)
        stop_pid("kafka", rec.pid, rec.starttime, timeout_s=10)
        remove_record(d, "kafka")
        raise ServiceError(f"{exc}\n{out}") from None
    log(f"kafka: ready in {time.monotonic() - t0:.1f}s")
    return rec


# --- a minimal Kafka wire-protocol client: ApiVersions v0, then Metadata v1..v8 -------------

API_METADATA = 3
API_VERSIONS = 18


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str | None:
        n = int(self.take(">h"))
        if n < 0:
            return None
        text = self.buf[self.pos : self.pos + n].decode()
        self.pos += n
        return text


def _kafka_call(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> _Reader:
    client_id = b"toolwitness-services"
    header = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", _recv_exact(sock, 4))[0]
    reader = _Reader(_recv_exact(sock, size))
    if reader.take(">i") != corr:
        raise OSError("kafka: correlation id mismatch")
    return reader


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks: list[bytes] = []
    while n > 0:
        chunk = sock.recv(n)
        if not chunk:
            raise OSError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def kafka_ready(port: int, timeout_s: float = 3.0) -> bool:
    """True once the broker answers Metadata and lists itself as a live (unfenced) broker."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
            r = _kafka_call(sock, API_VERSIONS, 0, 1, b"")
            if r.take(">h") != 0:
                return False
            ranges: dict[int, tuple[int, int]] = {}
            for _ in range(r.take(">i")):
                key, lo, hi = r.take(">h"), r.take(">h"), r.take(">h")
                ranges[int(key)] = (int(lo), int(hi))
            if API_METADATA not in ranges:
                return False
            lo, hi = ranges[API_METADATA]
            version = min(hi, 8)  # v9+ are "flexible" (compact) encodings; v1..v8 suffice here
            if version < max(lo, 1):
                return True  # a future broker without non-flexible Metadata: ApiVersions must do
            body = struct.pack(">i", 0)  # topics: empty array (no topics, just brokers)
            if version >= 4:
                body += struct.pack(">b", 0)  # allow_auto_topic_creation
            if version >= 8:
                body += struct.pack(">bb", 0, 0)  # include_*_authorized_operations
            r = _kafka_call(sock, API_METADATA, version, 2, body)
            if version >= 3:
                r.take(">i")  # throttle_time_ms
            ports: list[int] = []
            for _ in range(r.take(">i")):
                r.take(">i")  # node_id
                r.string()  # host
                ports.append(int(r.take(">i")))
                r.string()  # rack
            return port in ports
    except (OSError, struct.error, UnicodeDecodeError):
        return False


# --------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------


def wait_until(
    check: Any,
    timeout_s: float,
    service: str,
    logfile: Path,
    pid: int,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise ServiceError(
                f"{service}: process {pid} exited with code {proc.returncode} before becoming ready\n"
                + log_tail(logfile)
            )
        if proc is None and not pid_alive(pid):
            raise ServiceError(f"{service}: process {pid} died before becoming ready\n" + log_tail(logfile))
        if time.monotonic() > deadline:
            raise ServiceError(
                f"{service}: not ready after {timeout_s:.0f}s (pid {pid} still running)\n" + log_tail(logfile)
            )
        time.sleep(0.2)


SERVICES = ("redis", "kafka")


def cmd_up(cfg: Config) -> int:
    t0 = time.monotonic()
    with state_lock(cfg.state_dir):
        if "redis" in cfg.only:
            redis_up(cfg)
        if "kafka" in cfg.only:
            kafka_up(cfg)
    log(f"up in {time.monotonic() - t0:.1f}s; state in {cfg.state_dir}")
    print(f"KAFKA_BOOTSTRAP={cfg.kafka_bootstrap}")
    print(f"REDIS_URL={cfg.redis_url}")
    return 0


def cmd_down(cfg: Config) -> int:
    errors: list[str] = []
    with state_lock(cfg.state_dir):
        # Kafka first: it is the slow one and nothing depends on Redis to shut down.
        for service in reversed(SERVICES):
            if service not in cfg.only:
                continue
            d = cfg.state_dir / service
            rec = read_record(d, service)
            if rec is None:
                log(f"{service}: not started by us (no record)")
                continue
            try:
                stop_pid(service, rec.pid, rec.starttime)
            except ServiceError as exc:
                errors.append(str(exc))
                continue
            remove_record(d, service)
            log(f"{service}: stopped (pid {rec.pid})")
    for err in errors:
        print(err, file=sys.stderr)
    return 1 if errors else 0


def cmd_status(cfg: Config) -> int:
    all_up = True
    print(f"{'service':8} {'pid':>8}  {'ports':30} state")
    for service in SERVICES:
        rec = read_record(cfg.state_dir / service, service)
        if rec is None:
            print(f"{service:8} {'-':>8}  {'-':30} not started")
            all_up = False
            continue
        alive = rec.alive()
        ports = ",".join(f"{k}={v}" for k, v in rec.ports.items())
        main_port = rec.ports[service]
        listening = port_open(main_port)
        state = "alive" if alive and listening else ("alive, port closed" if alive else "dead")
        all_up = all_up and alive and listening
        print(f"{service:8} {rec.pid:>8}  {ports:30} {state}")
    return 0 if all_up else 3


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("TOOLWITNESS_SERVICES_STATE_DIR") or DEFAULT_STATE_DIR),
        help="where pid files, data and logs live (default .cache/services)",
    )
    common.add_argument(
        "--redis-port",
        type=int,
        default=None,
        help=f"default $TOOLWITNESS_SERVICES_REDIS_PORT or {DEFAULT_REDIS_PORT}",
    )
    common.add_argument(
        "--kafka-port",
        type=int,
        default=None,
        help=f"default $TOOLWITNESS_SERVICES_KAFKA_PORT or {DEFAULT_KAFKA_PORT}",
    )
    common.add_argument(
        "--controller-port",
        type=int,
        default=None,
        help=f"default $TOOLWITNESS_SERVICES_CONTROLLER_PORT or {DEFAULT_CONTROLLER_PORT}",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"readiness timeout per service in seconds (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    only = argparse.ArgumentParser(add_help=False)
    only.add_argument("--only", choices=SERVICES, default=None, help="act on this service only (default both)")
    up = sub.add_parser("up", parents=[common, only], help="start Redis and Kafka (idempotent)")
    up.add_argument("--keep-data", action="store_true", help="do not wipe data dirs of stopped services")
    sub.add_parser("down", parents=[common, only], help="stop the processes we started (by recorded pid)")
    sub.add_parser("status", parents=[common], help="show each service, pid, ports, alive/dead")
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    return Config(
        state_dir=Path(args.state_dir).resolve(),
        redis_port=args.redis_port or _env_int("TOOLWITNESS_SERVICES_REDIS_PORT", DEFAULT_REDIS_PORT),
        kafka_port=args.kafka_port or _env_int("TOOLWITNESS_SERVICES_KAFKA_PORT", DEFAULT_KAFKA_PORT),
        controller_port=args.controller_port
        or _env_int("TOOLWITNESS_SERVICES_CONTROLLER_PORT", DEFAULT_CONTROLLER_PORT),
        timeout_s=args.timeout or _env_float("TOOLWITNESS_SERVICES_TIMEOUT", DEFAULT_TIMEOUT_S),
        keep_data=bool(getattr(args, "keep_data", False)),
        only=(args.only,) if getattr(args, "only", None) else SERVICES,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        if args.command == "up":
            return cmd_up(cfg)
        if args.command == "down":
            return cmd_down(cfg)
        return cmd_status(cfg)
    except ServiceError as exc:
        print(f"[services] ERROR: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())

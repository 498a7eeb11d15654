#!/usr/bin/env bash
# Run the minimal toolwitness collector on loopback against a given Kafka bootstrap,
# in the foreground (Ctrl-C / SIGTERM stops it). Builds it first if needed
# (scripts/tools.sh collector, cached in .cache/tools/otelcol-toolwitness).
#
#   deploy/collector/run-local.sh [BOOTSTRAP] [-- extra collector args]
#
#   BOOTSTRAP             Kafka bootstrap, host:port[,host:port] (default: $KAFKA_BROKERS
#                         or 127.0.0.1:9092)
#   OTLP_GRPC_ENDPOINT    default 127.0.0.1:4317
#   OTLP_HTTP_ENDPOINT    default 127.0.0.1:4318
#   OTELCOL_METRICS_PORT  default 8889 (the collector's own metrics, on 127.0.0.1)
#   HEALTH_CHECK_ENDPOINT default 127.0.0.1:13133 (GET / -> 200 once the pipeline runs)
#   KAFKA_SPANS_TOPIC     default otlp_spans (must exist: auto-creation is off)
#
# Everything listens on 127.0.0.1 only. An interop test starts this in the background,
# exports spans with the real OTel SDK to OTLP_GRPC_ENDPOINT, and reads the topic.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

bootstrap="${KAFKA_BROKERS:-127.0.0.1:9092}"
if [[ $# -gt 0 && "$1" != "--" ]]; then
  bootstrap="$1"
  shift
fi
if [[ $# -gt 0 && "$1" == "--" ]]; then
  shift
fi

bin="$("$root/scripts/tools.sh" collector)"

export KAFKA_BROKERS="$bootstrap"
export OTLP_GRPC_ENDPOINT="${OTLP_GRPC_ENDPOINT:-127.0.0.1:4317}"
export OTLP_HTTP_ENDPOINT="${OTLP_HTTP_ENDPOINT:-127.0.0.1:4318}"
export OTELCOL_METRICS_PORT="${OTELCOL_METRICS_PORT:-8889}"
export HEALTH_CHECK_ENDPOINT="${HEALTH_CHECK_ENDPOINT:-127.0.0.1:13133}"

echo "run-local.sh: $bin: OTLP grpc=$OTLP_GRPC_ENDPOINT http=$OTLP_HTTP_ENDPOINT -> Kafka $KAFKA_BROKERS topic ${KAFKA_SPANS_TOPIC:-otlp_spans}" >&2
exec "$bin" --config "$here/config.yaml" "$@"

#!/usr/bin/env bash
# Pinned developer tools, built from source with the Go toolchain and cached under
# .cache/ (git-ignored). Nothing is downloaded except Go modules by their pinned
# versions, so a fresh machine rebuilds exactly the same tools.
#
#   scripts/tools.sh helm        build (if needed) and print the path of helm
#   scripts/tools.sh collector   build (if needed) and print the path of otelcol-toolwitness
#   scripts/tools.sh tailsampling build (if needed) and print the path of otelcol-tailsampling
#                                (the `toolwitness bench vs-tailsampling` comparison Collector)
#   scripts/tools.sh versions    print the pinned versions
#
# Everything Go writes (module cache, build cache, binaries) lives in .cache/go and
# .cache/tools, so a second run is a cache hit and a `rm -rf .cache` is a clean slate.
# A lock file serialises concurrent callers (parallel test workers, make -j).
set -euo pipefail

HELM_VERSION="v3.22.0"
# The collector builder (ocb) and every component in deploy/collector/builder-config.yaml
# must come from one collector release: core v0.165.0 / v1.71.0, contrib v0.165.1.
OCB_VERSION="v0.165.0"
# The tail-sampling comparison Collector (deploy/collector/tailsampling/builder-config.yaml)
# is built by this ocb (the same release; see that manifest for its one older component).
TAILSAMPLING_OCB_VERSION="$OCB_VERSION"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
TOOLS="$CACHE/tools"

GO="${GO:-$(command -v go || true)}"
if [[ -z "$GO" && -x /usr/local/go/bin/go ]]; then
  GO=/usr/local/go/bin/go
fi

log() { printf 'tools.sh: %s\n' "$*" >&2; }

need_go() {
  if [[ -z "$GO" ]]; then
    log "no Go toolchain found (set GO=/path/to/go)"
    exit 1
  fi
  export GOPATH="$CACHE/go"
  export GOMODCACHE="$CACHE/go/mod"
  export GOCACHE="$CACHE/go/build"
  export GOBIN="$TOOLS"
  export CGO_ENABLED=0
  # Keep the module cache writable-by-owner only as Go does, but let `rm -rf .cache` work.
  export GOFLAGS="${GOFLAGS:+$GOFLAGS }-modcacherw"
  mkdir -p "$TOOLS" "$GOMODCACHE" "$GOCACHE"
}

# with_lock NAME CMD...: run CMD under an exclusive lock on .cache/tools/NAME.lock.
with_lock() {
  local name="$1"
  shift
  mkdir -p "$TOOLS"
  exec {lockfd}>"$TOOLS/$name.lock"
  flock "$lockfd"
  "$@"
  exec {lockfd}>&-
}

build_helm() {
  local bin="$TOOLS/helm" stamp="$TOOLS/helm.version"
  if [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$HELM_VERSION" ]]; then
    return 0
  fi
  need_go
  log "building helm $HELM_VERSION from its Go module (first time only) ..."
  local start=$SECONDS
  # Stamp the same -ldflags as helm's own Makefile: the release version, and the
  # Kubernetes version that `helm template`/`lint` assume (.Capabilities.KubeVersion,
  # deprecation checks) derived from the k8s.io/client-go that helm is built with
  # (v0.N.x -> 1.N). Without them helm would claim Kubernetes 1.20.
  "$GO" mod download "helm.sh/helm/v3@$HELM_VERSION"
  local gomod client_go major minor
  gomod="$GOMODCACHE/cache/download/helm.sh/helm/v3/@v/$HELM_VERSION.mod"
  client_go="$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod")"
  IFS=. read -r major minor _ <<<"${client_go#v}"
  major=$((major + 1))
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ld+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major"
  ld+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  ld+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major"
  ld+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  "$GO" install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  printf '%s\n' "$HELM_VERSION" >"$stamp"
  log "helm $HELM_VERSION built in $((SECONDS - start))s -> $bin"
}

build_ocb() {
  local bin="$TOOLS/builder" stamp="$TOOLS/builder.version"
  if [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$OCB_VERSION" ]]; then
    return 0
  fi
  need_go
  log "building the collector builder (ocb) $OCB_VERSION ..."
  "$GO" install -trimpath -ldflags "-s -w" "go.opentelemetry.io/collector/cmd/builder@$OCB_VERSION"
  printf '%s\n' "$OCB_VERSION" >"$stamp"
}

build_collector() {
  local manifest="$ROOT/deploy/collector/builder-config.yaml"
  local bin="$TOOLS/otelcol-toolwitness" stamp="$TOOLS/otelcol-toolwitness.sha256"
  local want
  want="$( (cat "$manifest"; echo "$OCB_VERSION") | sha256sum | cut -d' ' -f1)"
  if [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  build_ocb
  need_go
  log "building otelcol-toolwitness from $manifest ..."
  local start=$SECONDS
  # ocb generates the distribution's sources into output_path and runs `go build`;
  # it inherits GOMODCACHE/GOCACHE from need_go, so modules are cached under .cache/.
  local work="$CACHE/otelcol-toolwitness"
  # output_path in the manifest is relative to the repository root.
  (cd "$ROOT" && "$TOOLS/builder" --config "$manifest" --skip-strict-versioning=false) 2>&1 \
    | sed 's/^/  ocb: /' >&2
  install -m 0755 "$work/otelcol-toolwitness" "$bin"
  printf '%s\n' "$want" >"$stamp"
  log "otelcol-toolwitness built in $((SECONDS - start))s -> $bin"
}

# build_ocb_at VERSION: the builder at VERSION in .cache/tools/ocb-VERSION/builder (other
# releases than OCB_VERSION, never overwriting .cache/tools/builder).
build_ocb_at() {
  local version="$1"
  local dir="$TOOLS/ocb-$version"
  if [[ -x "$dir/builder" ]]; then
    return 0
  fi
  need_go
  log "building the collector builder (ocb) $version ..."
  mkdir -p "$dir"
  GOBIN="$dir" "$GO" install -trimpath -ldflags "-s -w" "go.opentelemetry.io/collector/cmd/builder@$version"
}

# build_distribution NAME MANIFEST OCB_VER: build an ocb distribution whose dist.name is NAME and
# whose output_path is .cache/NAME, cached by the manifest's and the builder's hash.
build_distribution() {
  local name="$1" manifest="$2" ocb="$3"
  local bin="$TOOLS/$name" stamp="$TOOLS/$name.sha256"
  local want
  want="$( (cat "$manifest"; echo "$ocb") | sha256sum | cut -d' ' -f1)"
  if [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  local ocb_bin="$TOOLS/ocb-$ocb/builder"
  if [[ "$ocb" == "$OCB_VERSION" ]]; then
    build_ocb
    ocb_bin="$TOOLS/builder"
  else
    build_ocb_at "$ocb"
  fi
  need_go
  log "building $name from $manifest with ocb $ocb ..."
  local start=$SECONDS
  (cd "$ROOT" && "$ocb_bin" --config "$manifest" --skip-strict-versioning=false) 2>&1 \
    | sed 's/^/  ocb: /' >&2
  install -m 0755 "$CACHE/$name/$name" "$bin"
  printf '%s\n' "$want" >"$stamp"
  log "$name built in $((SECONDS - start))s -> $bin"
}

build_tailsampling() {
  build_distribution otelcol-tailsampling "$ROOT/deploy/collector/tailsampling/builder-config.yaml" \
    "$TAILSAMPLING_OCB_VERSION"
}

case "${1:-}" in
  helm)
    with_lock helm build_helm
    echo "$TOOLS/helm"
    ;;
  collector)
    with_lock collector build_collector
    echo "$TOOLS/otelcol-toolwitness"
    ;;
  tailsampling)
    with_lock tailsampling build_tailsampling
    echo "$TOOLS/otelcol-tailsampling"
    ;;
  versions)
    echo "helm $HELM_VERSION"
    echo "ocb $OCB_VERSION"
    echo "ocb (tail-sampling comparison) $TAILSAMPLING_OCB_VERSION"
    ;;
  *)
    echo "usage: $0 {helm|collector|tailsampling|versions}" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Builds upstream Kueue's controller manager twice, from the Go module proxy,
# for the cluster test that compares github.com/kadmit/kadmit/pkg/webhookcerts
# with open-policy-agent/cert-controller (the rotator Kueue ships with):
#
#   $OUT/manager-upstream      sigs.k8s.io/kueue's cmd/kueue, built inside a
#                              copy of the module with Kueue's own go.mod and
#                              go.sum: Kueue as upstream wires it
#   $OUT/manager-webhookcerts  test/kueue: the same manager, certificates
#                              through pkg/webhookcerts (test/kueue/main.go)
#   $OUT/chart/                Kueue's Helm chart (charts/kueue) from the same
#                              module: CRDs (with their conversion webhooks),
#                              RBAC, webhook configurations, Service, Secret,
#                              Deployment; the cluster test installs it with
#                              the Helm SDK and overrides the image
#
# Usage: hack/kueue.sh              build (skips what is already built)
#        hack/kueue.sh --print-dir  print the cache directory and exit
#
# Environment: KADMIT_KUEUE_DIR (default ~/.cache/kadmit/kueue/$KUEUE_VERSION).
#
# Both binaries: CGO_ENABLED=0, -trimpath, the same -ldflags (Kueue's version
# stamps; unstripped, as Kueue's Makefile builds them), the same Go
# toolchain. test/kueue/go.mod copies Kueue's require blocks, so both select
# the same module versions; this script checks it before building.
#
# Cold, measured with an empty GOCACHE and module downloads on the shared
# 2-core machine: manager-upstream ~430 CPU-s (370 user + 60 system; 11 min
# wall under load); manager-webhookcerts then ~85 CPU-s more (Kueue's
# packages compile again, as a dependency module rather than the main
# module), or ~365 CPU-s on its own. Warm: a stamp per artifact (its inputs'
# hash, the Go version, the ldflags), under 0.1 s; an edit to test/kueue or
# pkg/webhookcerts relinks manager-webhookcerts (~10 s).
#
# Why from source: no network but the module proxy is reachable here, so
# Kueue's release images are out of reach.
set -euo pipefail

# Pinned by test/kueue/go.mod (require sigs.k8s.io/kueue); change both together.
KUEUE_VERSION=v0.17.0
OUT="${KADMIT_KUEUE_DIR:-${HOME}/.cache/kadmit/kueue/${KUEUE_VERSION}}"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi
[[ $# -eq 0 ]] || { echo "usage: $0 [--print-dir]" >&2; exit 2; }

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
log() { echo "kueue: $*" >&2; }
die() { log "error: $*"; exit 1; }
command -v go >/dev/null || die "go is not on PATH"

mkdir -p "$OUT"
exec 9>"$OUT/.build.lock"
flock 9

export GOWORK=off CGO_ENABLED=0
GOVERSION="$(go env GOVERSION)"
VERSION_PKG=sigs.k8s.io/kueue/pkg/version
SRC="" # the module's directory in the module cache, once downloaded
WORK="" # a temporary copy of Kueue's module, removed on exit
trap '[[ -z "$WORK" ]] || rm -rf "$WORK"' EXIT

# kueue_src sets SRC, downloading sigs.k8s.io/kueue@KUEUE_VERSION if needed.
kueue_src() {
  [[ -n "$SRC" ]] && return
  local json
  # From $OUT, outside any module: nobody's go.mod or go.sum is touched.
  json="$(cd "$OUT" && go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" 2>&1)" ||
    die "cannot download sigs.k8s.io/kueue@${KUEUE_VERSION} from the module proxy ($(go env GOPROXY)):
$json"
  SRC="$(sed -n 's/.*"Dir": "\(.*\)".*/\1/p' <<<"$json")"
  local info; info="$(sed -n 's/.*"Info": "\(.*\)".*/\1/p' <<<"$json")"
  BUILD_DATE="$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$info" 2>/dev/null || true)"
  [[ -n "$BUILD_DATE" ]] || die "no publication time in $info"
  [[ -f "$SRC/cmd/kueue/main.go" ]] || die "sigs.k8s.io/kueue@${KUEUE_VERSION} has no cmd/kueue/main.go (in '$SRC')"
}

# ldflags: Kueue's Makefile stamps these three. The module proxy does not
# know the commit; BuildDate is the version's publication time on the proxy,
# so both builds are reproducible.
ldflags() {
  echo "-X ${VERSION_PKG}.GitVersion=${KUEUE_VERSION} -X ${VERSION_PKG}.GitCommit=unknown -X ${VERSION_PKG}.BuildDate=${BUILD_DATE}"
}

# fresh NAME KEY reports whether $OUT/NAME exists and was built from KEY.
fresh() { [[ -e "$OUT/$1" && -f "$OUT/.$1.stamp" && "$(<"$OUT/.$1.stamp")" == "$2" ]]; }

# timed LABEL CMD... runs CMD and logs its wall and CPU time (bash's time
# keyword: user and system time include the children, the compiler's).
timed() {
  local label="$1" TIMEFORMAT; shift
  TIMEFORMAT="kueue: $label: %1R s wall, %1U s user + %1S s system CPU"
  time "$@"
}

build_upstream() {
  kueue_src
  local key="kueue ${KUEUE_VERSION} ${GOVERSION} cmd/kueue $(ldflags)"
  if fresh manager-upstream "$key"; then
    log "manager-upstream ${KUEUE_VERSION} already built in $OUT"
    return
  fi
  local work; work="$(mktemp -d)"
  WORK="$work"
  # Kueue's module exactly (go.mod, go.sum, sources), writable so the go
  # command may use it as the main module.
  cp -R "$SRC/." "$work/" && chmod -R u+w "$work"
  log "building manager-upstream (sigs.k8s.io/kueue@${KUEUE_VERSION} cmd/kueue, Kueue's go.mod) in $work"
  (cd "$work" && timed "manager-upstream" go build -mod=readonly -trimpath -ldflags "$(ldflags)" -o "$OUT/manager-upstream.tmp" ./cmd/kueue) ||
    die "building manager-upstream failed (above)"
  mv "$OUT/manager-upstream.tmp" "$OUT/manager-upstream"
  rm -rf "$work"; WORK=""
  echo "$key" > "$OUT/.manager-upstream.stamp"
  log "manager-upstream built: $OUT/manager-upstream ($(du -h "$OUT/manager-upstream" | cut -f1))"
}

# same_versions fails unless every module both build lists hold is selected
# at the same version in test/kueue as in Kueue's own module: the library
# must build against what Kueue pins.
same_versions() {
  kueue_src
  local ours theirs diff
  ours="$(cd "$ROOT/test/kueue" && go list -mod=readonly -m -f '{{.Path}} {{.Version}}' all | sort)" ||
    die "go list -m all failed in test/kueue (above)"
  theirs="$(cd "$SRC" && go list -m -f '{{.Path}} {{.Version}}' all | sort)" ||
    die "go list -m all failed in sigs.k8s.io/kueue@${KUEUE_VERSION} (above)"
  diff="$(join <(echo "$ours") <(echo "$theirs") | awk 'NF == 3 && $2 != $3 {print "  " $1 ": test/kueue " $2 ", kueue " $3}')"
  [[ -z "$diff" ]] || die "test/kueue selects other versions than Kueue ${KUEUE_VERSION} does (raise nothing in pkg/webhookcerts/go.mod above Kueue's pins):
$diff"
}

build_webhookcerts() {
  # The inputs: test/kueue and the library, sources and module files.
  kueue_src
  local key
  key="$(cd "$ROOT" && { echo "${GOVERSION} ${KUEUE_VERSION} $(ldflags)"; find test/kueue pkg/webhookcerts -type f \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum \) -print0 | sort -z | xargs -0 sha256sum; } | sha256sum | cut -d' ' -f1)"
  if fresh manager-webhookcerts "$key"; then
    log "manager-webhookcerts already built in $OUT (test/kueue and pkg/webhookcerts unchanged)"
    return
  fi
  [[ -f "$ROOT/pkg/webhookcerts/go.mod" ]] || die "pkg/webhookcerts is missing: test/kueue builds the library from this tree"
  same_versions
  log "building manager-webhookcerts (test/kueue, github.com/kadmit/kadmit/pkg/webhookcerts)"
  # -mod=readonly: the build never edits test/kueue/go.mod or go.sum.
  (cd "$ROOT/test/kueue" && timed "manager-webhookcerts" go build -mod=readonly -trimpath -ldflags "$(ldflags)" -o "$OUT/manager-webhookcerts.tmp" .) ||
    die "building manager-webhookcerts failed (above); after a change to pkg/webhookcerts/go.mod, a \"missing go.sum entry\" is fixed by running \`go build -mod=mod .\` once in test/kueue (not go mod tidy, see its go.mod)"
  mv "$OUT/manager-webhookcerts.tmp" "$OUT/manager-webhookcerts"
  echo "$key" > "$OUT/.manager-webhookcerts.stamp"
  log "manager-webhookcerts built: $OUT/manager-webhookcerts ($(du -h "$OUT/manager-webhookcerts" | cut -f1))"
}

copy_chart() {
  local key="kueue ${KUEUE_VERSION} charts/kueue v1"
  if fresh chart "$key" && [[ -f "$OUT/chart/Chart.yaml" ]]; then
    log "chart ${KUEUE_VERSION} already in $OUT/chart"
    return
  fi
  kueue_src
  [[ -f "$SRC/charts/kueue/Chart.yaml" ]] || die "sigs.k8s.io/kueue@${KUEUE_VERSION} has no charts/kueue"
  rm -rf "$OUT/chart.tmp" "$OUT/chart"
  cp -R "$SRC/charts/kueue" "$OUT/chart.tmp" && chmod -R u+w "$OUT/chart.tmp"
  mv "$OUT/chart.tmp" "$OUT/chart"
  echo "$key" > "$OUT/.chart.stamp"
  log "chart copied: $OUT/chart (kueue $(sed -n 's/^version: //p' "$OUT/chart/Chart.yaml"))"
}

copy_chart
build_upstream
build_webhookcerts
echo "$OUT"

#!/usr/bin/env bash
# Builds pinned kube-apiserver, etcd and kubectl from the Go module proxy into
# a cache directory that controller-runtime's envtest uses as
# BinaryAssetsDirectory. kubectl runs the doctor e2e's kubectl-plugin and
# printed-fix tests (test/e2e/doctor finds it here before PATH), so a fresh
# machine needs no kubectl of its own.
#
# Usage: hack/controlplane.sh            build (skips what is already built)
#        hack/controlplane.sh --print-dir print the cache directory and exit
#
# Environment: KUBE_VERSION (default v1.37.1), ETCD_VERSION (default v3.6.16),
#              KADMIT_CONTROLPLANE_DIR (default ~/.cache/kadmit/controlplane/$KUBE_VERSION),
#              KUBE_APISERVER_GCFLAGS (go build -gcflags for kube-apiserver; empty:
#              the compiler's defaults. `make controlplane-minors` passes
#              'all=-N -l' for the older minors: about a fifth less compile CPU,
#              for binaries that serve a few tests).
#
# Two builds of the same directory at once (make test starts the older minors
# in the background) take turns: the second finds the binaries built.
#
# Why from source: no network but the module proxy is reachable here, so the
# release tarballs envtest normally downloads are out of reach. k8s.io/kubernetes
# replaces its staging modules with local paths; we rewrite those to the
# published k8s.io/<x> v0.<minor>.<patch> modules.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.1}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
OUT="${KADMIT_CONTROLPLANE_DIR:-${HOME}/.cache/kadmit/controlplane/${KUBE_VERSION}}"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi

mkdir -p "$OUT"
log() { echo "controlplane: $*" >&2; }
# reports whether binary $1 prints $2 in its --version. Not `--version |
# grep -q`: grep stops at the first match, the binary then gets SIGPIPE, and
# under pipefail a built binary would look missing and be built again.
has_version() { [[ -x "$1" ]] && [[ "$("$1" --version 2>/dev/null)" == *"$2"* ]]; }
exec 9>"$OUT/.build.lock"
flock 9

# kube_module writes into directory $1 a go.mod requiring k8s.io/kubernetes
# at KUBE_VERSION, its staging modules replaced by the published ones.
kube_module() {
  local work="$1" gomod
  gomod="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [[ -f "$gomod" ]] || { log "cannot download k8s.io/kubernetes@${KUBE_VERSION}"; exit 1; }
  # Keep kubernetes' own require blocks so every dependency is at the version
  # the release was built with; rewrite staging replaces to published modules.
  sed -e "s#^module k8s.io/kubernetes#module kadmit.local/kube-apiserver#" \
      -e "s#^\(\s*\)\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/[a-z0-9-]*#\1\2 => \2 ${STAGING_VERSION}#" \
      -e '/^godebug/d' -e '/^tool /d' "$gomod" > "$work/go.mod"
  printf '\nrequire k8s.io/kubernetes %s\n' "$KUBE_VERSION" >> "$work/go.mod"
}

build_apiserver() {
  if has_version "$OUT/kube-apiserver" "$KUBE_VERSION"; then
    log "kube-apiserver $KUBE_VERSION already built in $OUT"
    return
  fi
  local work; work="$(mktemp -d)"
  log "building kube-apiserver $KUBE_VERSION in $work (cold: ~7 min on 2 cores)"
  kube_module "$work"
  cat > "$work/main.go" <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
GO
  local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  local pkg=k8s.io/component-base/version
  (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath ${KUBE_APISERVER_GCFLAGS:+-gcflags="$KUBE_APISERVER_GCFLAGS"} \
      -ldflags "-s -w -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean" \
      -o "$OUT/kube-apiserver.tmp" .)
  mv "$OUT/kube-apiserver.tmp" "$OUT/kube-apiserver"
  rm -rf "$work"
  log "kube-apiserver built: $("$OUT/kube-apiserver" --version)"
}

build_etcd() {
  if has_version "$OUT/etcd" "${ETCD_VERSION#v}"; then
    log "etcd $ETCD_VERSION already built in $OUT"
    return
  fi
  # etcd does not depend on the Kubernetes version: reuse the binary of the
  # same etcd version another version's cache directory holds (only under
  # the project's own cache root) rather than build it again.
  local sib
  for sib in "${HOME}/.cache/kadmit/controlplane"/*/etcd; do
    if [[ "$sib" != "$OUT/etcd" ]] && has_version "$sib" "${ETCD_VERSION#v}"; then
      cp "$sib" "$OUT/etcd.tmp" && mv "$OUT/etcd.tmp" "$OUT/etcd"
      log "etcd $ETCD_VERSION copied from $sib"
      return
    fi
  done
  local work; work="$(mktemp -d)"
  log "building etcd $ETCD_VERSION in $work (cold: ~1 min)"
  cat > "$work/go.mod" <<MOD
module kadmit.local/etcd

go 1.24

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
MOD
  cat > "$work/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || true)
  (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" .)
  mv "$OUT/etcd.tmp" "$OUT/etcd"
  rm -rf "$work"
  log "etcd built: $("$OUT/etcd" --version | head -1)"
}

# kubectl from the same k8s.io/kubernetes module as kube-apiserver
# (cmd/kubectl, its own main package), stamped with the same version.
build_kubectl() {
  if [[ -x "$OUT/kubectl" ]] && [[ "$("$OUT/kubectl" version --client 2>/dev/null)" == *"$KUBE_VERSION"* ]]; then
    log "kubectl $KUBE_VERSION already built in $OUT"
    return
  fi
  local work; work="$(mktemp -d)"
  log "building kubectl $KUBE_VERSION in $work (cold: ~4 min on 2 cores)"
  kube_module "$work"
  local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  local flags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
  done
  (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$flags" -o "$OUT/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl)
  mv "$OUT/kubectl.tmp" "$OUT/kubectl"
  rm -rf "$work"
  log "kubectl built: $("$OUT/kubectl" version --client | head -1)"
}

build_etcd
build_apiserver
build_kubectl
echo "$OUT"

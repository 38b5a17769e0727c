#!/usr/bin/env bash
# Builds pinned kube-apiserver, etcd and kubectl from the Go module proxy into
# a cache directory that controller-runtime's envtest uses as
# BinaryAssetsDirectory. kubectl runs the doctor e2e's kubectl-plugin and
# printed-fix tests (test/e2e/doctor finds it here before PATH), so a fresh
# machine needs no kubectl of its own.
#
# Usage: hack/controlplane.sh            build (skips what is already built)
#        hack/controlplane.sh --node     also build what a real node needs
#                                        (test/cluster): containerd, its runc
#                                        shim and ctr from containerd's module,
#                                        and Debian's runc, CNI plugins and
#                                        iptables (installed with apt-get when
#                                        missing; CI runs as root)
#        hack/controlplane.sh --print-dir print the cache directory and exit
#
# For the pinned version (v1.37.1) the Kubernetes components are one
# multi-call binary, $OUT/kube, dispatching on the name it is called by:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy and kubectl are symlinks to it. The components share most of
# their packages, so one link costs little more than kube-apiserver alone
# (~700 CPU-s cold): 860 CPU-s measured for it and containerd together with
# an empty build cache (docs/real-cluster.md); the older minors keep their
# apiserver-only builds (KUBE_MULTICALL=0).
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

PINNED_KUBE_VERSION=v1.37.1
KUBE_VERSION="${KUBE_VERSION:-$PINNED_KUBE_VERSION}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
if [[ "$KUBE_VERSION" == "$PINNED_KUBE_VERSION" ]]; then KUBE_MULTICALL="${KUBE_MULTICALL:-1}"; else KUBE_MULTICALL="${KUBE_MULTICALL:-0}"; fi
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
OUT="${KADMIT_CONTROLPLANE_DIR:-${HOME}/.cache/kadmit/controlplane/${KUBE_VERSION}}"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi
WITH_NODE=0
[[ "${1:-}" == "--node" ]] && WITH_NODE=1

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


# The components a multi-call binary serves; each is a symlink to $OUT/kube.
KUBE_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

# build_multicall builds $OUT/kube, dispatching on basename(argv[0]) (or on
# its first argument when called as kube), and links every component to it.
# A component already built on its own (a cache from before the multi-call
# binary) is kept: it is the same source at the same version.
build_multicall() {
  # kube --version is not a component: ask the API server it embeds.
  if [[ -x "$OUT/kube" ]] && [[ "$("$OUT/kube" kube-apiserver --version 2>/dev/null)" == *"$KUBE_VERSION"* ]]; then
    log "kube (multi-call) $KUBE_VERSION already built in $OUT"
  else
    local work; work="$(mktemp -d)"
    log "building the multi-call kube $KUBE_VERSION in $work (cold: ~750 CPU-s, ~7 min on 2 cores)"
    kube_module "$work"
    cat > "$work/main.go" <<'GO'
// kube runs one Kubernetes component, chosen by the name it was called by
// (a symlink) or, when called as kube, by its first argument.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones in kube-controller-manager

	"github.com/spf13/cobra"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kube-proxy":              proxy.NewProxyCommand,
}

func main() {
	name := filepath.Base(os.Args[0])
	if name == "kube" && len(os.Args) > 1 {
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	if name == "kubectl" {
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return
	}
	newCommand, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kube: unknown component %q (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl)\n", name)
		os.Exit(2)
	}
	os.Exit(cli.Run(newCommand()))
}
GO
    local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    local flags="-s -w" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      flags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
    done
    (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$flags" -o "$OUT/kube.tmp" .)
    mv "$OUT/kube.tmp" "$OUT/kube"
    rm -rf "$work"
    log "kube built: $("$OUT/kube" kube-apiserver --version)"
  fi
  local c
  for c in "${KUBE_COMPONENTS[@]}"; do
    if [[ -e "$OUT/$c" && ! -L "$OUT/$c" ]]; then continue; fi
    ln -sfn kube "$OUT/$c"
  done
}

# build_node builds containerd, its runc shim and ctr from containerd's Go
# module into $OUT/node (kubelet 1.36+ needs containerd 2.x; Debian's is
# 1.6), static, with the tags that drop the cgo storage drivers; and installs
# Debian's runc, CNI plugins (/usr/lib/cni), iptables and conntrack when
# missing (kube-proxy's iptables mode needs iptables-nft).
build_node() {
  local missing=() p
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/portmap && -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    if [[ $(id -u) -ne 0 ]]; then log "needs root to apt-get install ${missing[*]}"; exit 1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
      { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
  fi
  local dir="$OUT/node"
  mkdir -p "$dir"
  if has_version "$dir/containerd" "$CONTAINERD_VERSION" && [[ -x "$dir/containerd-shim-runc-v2" && -x "$dir/ctr" ]]; then
    log "containerd $CONTAINERD_VERSION already built in $dir"
    return
  fi
  local work; work="$(mktemp -d)"
  log "building containerd $CONTAINERD_VERSION in $work (cold: ~240 CPU-s)"
  cat > "$work/go.mod" <<MOD
module kadmit.local/containerd

go 1.26

require github.com/containerd/containerd/v2 ${CONTAINERD_VERSION}
MOD
  local tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs no_devmapper no_zfs"
  local ld="-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}"
  (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "$ld" -o "$dir/containerd.tmp" github.com/containerd/containerd/v2/cmd/containerd)
  (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -tags "$tags no_grpc" -ldflags "$ld" -o "$dir/containerd-shim-runc-v2" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2)
  (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "$ld" -o "$dir/ctr" github.com/containerd/containerd/v2/cmd/ctr)
  mv "$dir/containerd.tmp" "$dir/containerd"
  rm -rf "$work"
  log "containerd built: $("$dir/containerd" --version)"
}

build_etcd
if [[ "$KUBE_MULTICALL" == 1 ]]; then build_multicall; fi
build_apiserver
build_kubectl
if [[ "$WITH_NODE" == 1 ]]; then build_node; fi
echo "$OUT"

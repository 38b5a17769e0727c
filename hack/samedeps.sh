#!/usr/bin/env bash
# Fails when a nested test module (test/, test/deploy/) builds a package that
# kadmit's own module also builds, at another module version. One differing
# module low in the graph (golang.org/x/sys, say) gives every Kubernetes
# package above it a new build ID, so a fresh machine compiles client-go,
# apimachinery and apiserver once per module: about 7 minutes of a cold
# `make test` on 2 cores. Fix: raise the version in kadmit's go.mod (go get
# MODULE@VERSION) to the one the test module selects.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs() { # module dir -> "importpath module version", non-test packages only
  (cd "$1" && go list -deps -test -f '{{if .Module}}{{.ImportPath}} {{.Module.Path}} {{.Module.Version}}{{end}}' ./... | grep -v '\[' | sort -u)
}

main="$(mktemp)"; other="$(mktemp)"
trap 'rm -f "$main" "$other"' EXIT
pkgs . > "$main"
status=0
for dir in test test/deploy; do
  pkgs "$dir" > "$other"
  diff="$(join "$main" "$other" | awk '$3 != $5 && $2 != "github.com/kadmit/kadmit" {print "  " $2 ": kadmit " $3 ", '"$dir"' " $5}' | sort -u)"
  if [[ -n "$diff" ]]; then
    echo "$dir builds packages kadmit builds, at other versions (a cold make test compiles them twice):"
    echo "$diff"
    status=1
  fi
done
exit "$status"

#!/usr/bin/env bash
# Runs one fuzz target briefly: hack/fuzz.sh PACKAGE TARGET FUZZTIME
#
# Go's fuzzing engine (go1.26) can end a run that found nothing with
# "context deadline exceeded" when -fuzztime runs out while a slow target's
# worker is busy (seen on a loaded 2-core machine, without a failing input).
# That is the engine's own timeout, not a finding, so such a run is tried again,
# at most three attempts in all. A real finding writes "Failing input written
# to ..." and fails at once.
#
# Each run starts from a fresh fuzz cache (-test.fuzzcachedir), so its
# baseline is the seeds in the code and testdata/fuzz only: the shared
# $GOCACHE/fuzz corpus grows with every run's "new interesting" inputs, and
# re-running a few hundred of them ate most of a 10 s run and made the
# engine's timeout likelier. Findings still land in testdata/fuzz.
set -uo pipefail
pkg=$1 target=$2 fuzztime=$3
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
for attempt in 1 2 3; do
  out=$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" -test.fuzzcachedir="$cache/$attempt" 2>&1)
  rc=$?
  printf '%s\n' "$out" | tail -n 4
  [ $rc = 0 ] && exit 0
  if [ $attempt -lt 3 ] && ! grep -q 'Failing input written' <<<"$out" && grep -q '^    context deadline exceeded$' <<<"$out"; then
    echo "fuzz.sh: $target: the engine timed out without a finding; trying again"
    continue
  fi
  printf '%s\n' "$out"
  exit $rc
done

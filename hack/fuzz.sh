#!/usr/bin/env bash
# Runs one fuzz target briefly: hack/fuzz.sh PACKAGE TARGET FUZZTIME
#
# Go's fuzzing engine (go1.26) can end a run that found nothing with
# "context deadline exceeded" when -fuzztime runs out while a slow target's
# worker is busy (seen on a loaded 2-core machine, without a failing input).
# That is the engine's own timeout, not a finding, so such a run is tried once
# more. A real finding writes "Failing input written to ..." and fails at once.
set -uo pipefail
pkg=$1 target=$2 fuzztime=$3
for attempt in 1 2; do
  out=$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" 2>&1)
  rc=$?
  printf '%s\n' "$out" | tail -n 4
  [ $rc = 0 ] && exit 0
  if [ $attempt = 1 ] && ! grep -q 'Failing input written' <<<"$out" && grep -q '^    context deadline exceeded$' <<<"$out"; then
    echo "fuzz.sh: $target: the engine timed out without a finding; trying once more"
    continue
  fi
  printf '%s\n' "$out"
  exit $rc
done

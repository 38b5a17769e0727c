#!/usr/bin/env bash
# Fails when a package outside kadmit's JSON layer imports the JSON scanner
# (internal/jsonedit/jsonscan), in its code or its tests. The layer is
# jsonedit (the document contract: Doc, ops, Apply, Index, and the reading
# API policies use: EachMember, EachElement, Unmarshal) and the
# AdmissionReview wire codec in internal/admission (envelope decoder,
# pruner, response encoder). Everything else reads JSON through jsonedit's
# API, so that there is one scanner, one member loop and one key-matching
# rule. Run by `make vet`; GO overrides the go command.
set -euo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"
scanner=github.com/kadmit/kadmit/internal/jsonedit/jsonscan
allowed=(
  github.com/kadmit/kadmit/internal/jsonedit
  github.com/kadmit/kadmit/internal/jsonedit/jsonscan
  github.com/kadmit/kadmit/internal/admission
)

status=0
for dir in . test; do
  [[ -f "$dir/go.mod" ]] || continue
  # Listed first, so that a failing go list fails the check (set -e).
  list="$(cd "$dir" && "$GO" list -f '{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./...)"
  # One line per package: its path, then what it, its tests and its
  # external tests import.
  while read -r pkg imports; do
    for imp in $imports; do
      [[ "$imp" == "$scanner" ]] || continue
      ok=0
      for a in "${allowed[@]}"; do
        [[ "$pkg" == "$a" ]] && ok=1
      done
      if (( ! ok )); then
        echo "check-jsonlayer: $pkg imports $scanner; only the JSON layer (${allowed[*]}) may." >&2
        echo "  Read JSON through jsonedit (Doc, EachMember, EachElement, Unmarshal) instead." >&2
        status=1
      fi
    done
  done <<< "$list"
done
exit "$status"

#!/usr/bin/env bash
# The import rules docs/architecture.md states for policies and the registry,
# checked on what Go builds (package imports, tests included), run by
# `make vet`:
#
#  1. A policy under internal/policy/<origin>/ (seed, kueue, koordinator,
#     kadmit) imports no policy of another origin: what two origins share
#     lives in internal/policy/shared.
#  2. Nothing internal/config depends on imports internal/config or
#     internal/builtin: the registry sits above the loader, never below it.
#  3. Only internal/builtin (and tests of cmd/, internal/serve, internal/review
#     and internal/config, which compose policies the way the server does)
#     imports policies of more than one origin.
#
# Usage: hack/check-layers.sh [go list pattern...]   (default ./...)
# Exit status 1 with one line per violation.
set -euo pipefail

mod=github.com/kadmit/kadmit
pkgs=("$@")
[[ ${#pkgs[@]} -gt 0 ]] || pkgs=(./...)

fail=0
report() { echo "check-layers: $*"; fail=1; }

# origin_of prints seed/kueue/koordinator/kadmit for a policy import path,
# nothing otherwise.
origin_of() {
	case $1 in
	"$mod"/internal/policy/seed/* | "$mod"/internal/policy/kueue/* | "$mod"/internal/policy/koordinator/* | "$mod"/internal/policy/kadmit/*)
		local rest=${1#"$mod"/internal/policy/}
		echo "${rest%%/*}"
		;;
	esac
}

# One line per package: path, then every import (build and tests).
while read -r pkg imports; do
	own=$(origin_of "$pkg")
	declare -A seen=()
	for imp in $imports; do
		o=$(origin_of "$imp")
		[[ -n $o ]] || continue
		if [[ -n $own && $o != "$own" ]]; then
			report "$pkg ($own) imports $imp ($o): share it through internal/policy/shared"
		fi
		seen[$o]=1
	done
	if [[ -z $own && ${#seen[@]} -gt 1 ]]; then
		case $pkg in
		"$mod"/internal/builtin | "$mod"/cmd/* | "$mod"/internal/serve | "$mod"/internal/review | "$mod"/internal/config | "$mod"/internal/admission) ;;
		*) report "$pkg imports policies of ${!seen[*]}: only internal/builtin composes policies of several origins" ;;
		esac
	fi
	unset seen
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' "${pkgs[@]}")

# Rule 2: the packages internal/config is built from.
while read -r dep; do
	[[ $dep == "$mod"/* ]] || continue
	[[ $dep == "$mod"/internal/config ]] && continue
	imps=$(go list -f '{{join .Imports " "}}' "$dep")
	for imp in $imps; do
		case $imp in
		"$mod"/internal/config | "$mod"/internal/builtin) report "$dep is below internal/config (config depends on it) but imports $imp" ;;
		esac
	done
done < <(go list -deps "$mod"/internal/config)

exit $fail

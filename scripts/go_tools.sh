#!/usr/bin/env bash
# Go programs the gNMI interoperability tests run against.
#
#   fake_server  openconfig's fake gNMI target (github.com/openconfig/gnmi, testing/fake) and
#   gnmi_cli     openconfig's reference gNMI client (same module): built with `go install` from
#                the Go module proxy into ~/.cache/rocewatch/go/bin (a repeat run does nothing)
#   gnmic        openconfig/gnmic, a gNMI collector many operators run (tests/test_gnmic_interop.py,
#                benchmarks/gnmi.py). The module proxy refuses github.com/openconfig/gnmic (every
#                version, 403), so it is not built here: it is taken from ../shared/bin/gnmic
#                beside the repository (gnmic 0.47.0 built from source) when its sha256 equals the
#                one ../shared/bin/README.md records, else from PATH. Without it the gnmic tests
#                cannot run: they skip, and under CI (CI set) this script fails instead.
#                tests/support/gnmic.py looks in the same places.
#
# Environment: ROCEWATCH_GO_DIR (default ~/.cache/rocewatch/go) holds GOBIN, GOPATH, GOMODCACHE
# and GOCACHE, so a second run and CI on the same machine reuse the module and build caches.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
GO_DIR="${ROCEWATCH_GO_DIR:-$HOME/.cache/rocewatch/go}"
GNMI_VERSION=v0.14.1
SHARED_BIN="$(cd "$ROOT/.." && pwd)/shared/bin"
export GOBIN="$GO_DIR/bin" GOPATH="$GO_DIR" GOMODCACHE="$GO_DIR/pkg/mod" GOCACHE="$GO_DIR/cache"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
mkdir -p "$GOBIN"

say() { printf '[go_tools] %s\n' "$*"; }

command -v go >/dev/null || {
    printf '[go_tools] ERROR: no `go` command on PATH (Go 1.22 or newer is needed)\n' >&2
    exit 1
}

install() { # NAME MODULE_PATH@VERSION
    if [ -x "$GOBIN/$1" ]; then
        say "$1: present ($GOBIN/$1)"
        return 0
    fi
    say "$1: go install $2 (compiles for a few minutes the first time)"
    go install "$2"
}

install fake_server "github.com/openconfig/gnmi/testing/fake/gnmi/cmd/fake_server@$GNMI_VERSION"
install gnmi_cli "github.com/openconfig/gnmi/cmd/gnmi_cli@$GNMI_VERSION"

say "binaries in $GOBIN: $(ls "$GOBIN" | tr '\n' ' ')"

ci() { case "${CI:-}" in "" | 0 | false | no) return 1 ;; *) return 0 ;; esac; }

gnmic_found=""
gnmic_problem=""
if [ -e "$SHARED_BIN/gnmic" ]; then
    want="$(sed -n '/^## gnmic/,/^## /s/.*sha256:[^0-9a-f]*\([0-9a-f]\{64\}\).*/\1/p' \
        "$SHARED_BIN/README.md" 2>/dev/null | head -n 1)"
    have="$(sha256sum "$SHARED_BIN/gnmic" | cut -d' ' -f1)"
    if [ -z "$want" ]; then
        gnmic_problem="$SHARED_BIN/gnmic: no sha256 recorded in $SHARED_BIN/README.md"
    elif [ "$have" != "$want" ]; then
        gnmic_problem="$SHARED_BIN/gnmic: sha256 $have differs from README.md's $want; not used"
    elif [ ! -x "$SHARED_BIN/gnmic" ]; then
        gnmic_problem="$SHARED_BIN/gnmic: not executable"
    else
        gnmic_found="$SHARED_BIN/gnmic"
    fi
fi
if [ -z "$gnmic_found" ] && command -v gnmic >/dev/null; then
    gnmic_found="$(command -v gnmic)"
fi
if [ -n "$gnmic_problem" ]; then
    printf '[go_tools] WARNING: %s\n' "$gnmic_problem" >&2
fi
if [ -n "$gnmic_found" ]; then
    say "gnmic: $gnmic_found ($("$gnmic_found" version 2>/dev/null | awk '/version/ {print $3; exit}'))"
else
    why="${gnmic_problem:-no $SHARED_BIN/gnmic and no gnmic on PATH}"
    if ci; then
        printf '[go_tools] ERROR: gnmic: %s; the gnmic interop tests cannot run (CI=%s)\n' \
            "$why" "$CI" >&2
        exit 1
    fi
    say "gnmic: NOT AVAILABLE ($why): tests/test_gnmic_interop.py will be skipped and"
    say "       benchmarks/gnmi.py cannot compare; put gnmic 0.47 on PATH or in $SHARED_BIN"
fi

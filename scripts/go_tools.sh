#!/usr/bin/env bash
# Go programs the interoperability tests run against: the gNMI peers and kube-apiserver.
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
#   kube-apiserver  the real Kubernetes API server (k8s.io/kubernetes at KUBE_VERSION) that
#                tests/support/kube.py starts on Debian's etcd (scripts/services.sh install):
#                one `go build` from the module proxy into $GOBIN/kube-apiserver-$KUBE_VERSION
#                (about 7 minutes on 2 busy cores the first time; a repeat run does nothing).
#   kube-controller-manager  from the same module, after kube-apiserver (it reuses that build's
#                module and build caches): tests/support/kube.py runs only its disruption
#                controller, so PodDisruptionBudgets get their status.
#
# Environment: ROCEWATCH_GO_DIR (default ~/.cache/rocewatch/go) holds GOBIN, GOPATH, GOMODCACHE
# and GOCACHE, so a second run and CI on the same machine reuse the module and build caches.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
GO_DIR="${ROCEWATCH_GO_DIR:-$HOME/.cache/rocewatch/go}"
GNMI_VERSION=v0.14.1
KUBE_VERSION=v1.34.2
KUBE_STAGING_VERSION=v0.34.2
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

# kube-apiserver and kube-controller-manager: k8s.io/kubernetes is not meant to be required as a
# module (its go.mod points every staging module at ./staging/src/...), so a throw-away module
# requires it and replaces each of those with the same module at the matching v0.x release. One
# `go build` per command, both from that one module, so the second reuses the module download and
# most of the build cache of the first (the controller-manager shares nearly all of its packages
# with the API server: client-go, apiserver, api, component-base). Each binary's name carries the
# version, so a warm run (or a pinned version already built) does nothing, and a version bump
# builds beside the old one.
kube_module() { # prints the throw-away module's directory, made once
    local mod="$GO_DIR/kube-build/$KUBE_VERSION" gomod staging
    # (go may move the require into a block: either spelling is this version's module)
    if [ -s "$mod/go.mod" ] &&
        grep -Eq "^(require )?[[:space:]]*k8s\.io/kubernetes $KUBE_VERSION( |\$)" "$mod/go.mod"; then
        printf '%s\n' "$mod"
        return 0
    fi
    rm -rf "$mod"
    mkdir -p "$mod"
    gomod="$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [ -s "$gomod" ] || {
        printf '[go_tools] ERROR: no go.mod for k8s.io/kubernetes@%s\n' "$KUBE_VERSION" >&2
        exit 1
    }
    staging="$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$gomod")"
    [ -n "$staging" ] || {
        printf '[go_tools] ERROR: %s replaces no staging module\n' "$gomod" >&2
        exit 1
    }
    {
        printf 'module rocewatch.invalid/kubeapiserver\n\ngo 1.24.0\n\n'
        printf 'require k8s.io/kubernetes %s\n\n' "$KUBE_VERSION"
        for m in $staging; do
            printf 'replace %s => %s %s\n' "$m" "$m" "$KUBE_STAGING_VERSION"
        done
    } >"$mod/go.mod"
    printf '%s\n' "$mod"
}

build_kube() { # COMMAND (kube-apiserver | kube-controller-manager) MINUTES
    local cmd="$1" bin="$GOBIN/$1-$KUBE_VERSION" mod t0
    if [ -x "$bin" ]; then
        say "$cmd: present ($bin)"
        return 0
    fi
    t0=$(date +%s)
    say "$cmd $KUBE_VERSION: go build from the module proxy (about $2 min on 2 cores)"
    mod="$(kube_module)"
    (
        cd "$mod"
        go get "k8s.io/kubernetes/cmd/$cmd@$KUBE_VERSION"
        # the version stamp Kubernetes' own build sets (else --version and /version say
        # v0.0.0-master); it changes only the link, not what is compiled
        local v="k8s.io/component-base/version" minor="${KUBE_VERSION#v1.}"
        minor="${minor%%.*}"
        CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" -ldflags "-s -w \
            -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor \
            -X $v.gitTreeState=clean" "k8s.io/kubernetes/cmd/$cmd"
    )
    mv "$bin.tmp" "$bin"
    say "$cmd: built $bin in $(($(date +%s) - t0)) s ($("$bin" --version))"
}
build_kube kube-apiserver 7
# after the API server: its module and build caches make this one a few minutes only (measured
# cold, after kube-apiserver's build: 2.6 CPU-minutes, 125 s user + 33 s system, and 29 more
# modules; 498 s of wall time on 2 cores shared with five other builds)
build_kube kube-controller-manager 3

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

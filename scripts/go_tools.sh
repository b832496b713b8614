#!/usr/bin/env bash
# Go programs the gNMI interoperability tests run against, built with `go install` from the Go
# module proxy into ~/.cache/rocewatch/go/bin (a repeat run finds them and does nothing).
#
#   fake_server  openconfig's fake gNMI target (github.com/openconfig/gnmi, testing/fake)
#   gnmi_cli     openconfig's reference gNMI client (same module): a third-party subscriber
#   gnmic        openconfig/gnmic v0.36.2 (the last release without `replace` directives), when
#                the module proxy serves it; optional, see below
#
# Environment: ROCEWATCH_GO_DIR (default ~/.cache/rocewatch/go) holds GOBIN, GOPATH, GOMODCACHE
# and GOCACHE, so a second run and CI on the same machine reuse the module and build caches.
set -euo pipefail

GO_DIR="${ROCEWATCH_GO_DIR:-$HOME/.cache/rocewatch/go}"
GNMI_VERSION=v0.14.1
GNMIC_VERSION=v0.36.2
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

# gnmic: the module proxy reachable from this project's machines refuses every version of
# github.com/openconfig/gnmic (403 "not available"), so it is tried, never required.
if ! install gnmic "github.com/openconfig/gnmic@$GNMIC_VERSION" 2>"$GO_DIR/gnmic-install.log"; then
    say "gnmic: not installed: $(tail -n 2 "$GO_DIR/gnmic-install.log" | tr '\n' ' ')"
fi
say "binaries in $GOBIN: $(ls "$GOBIN" | tr '\n' ' ')"

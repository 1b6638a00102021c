#!/usr/bin/env bash
# Build the API server's webhook-client double (bench/apiclient) once per source version into a cache folder, and
# print the binary's path.
#   bench/apiclient/build.sh   -> ~/.cache/gpushare-tools/apiclient-<hash of the sources>/apiclient
# Used by bench/bench_apiserver_client.py. The first build downloads k8s.io/apiserver and its dependencies through
# the Go module proxy (a few minutes); later builds of other versions need only the module cache, so they work
# offline. Exit 3 with one line on stderr when Go is missing; any other failure exits 1 with the build's output.
#   GPUSHARE_TOOLS_CACHE    the cache folder (default ~/.cache/gpushare-tools)
set -euo pipefail
cd "$(dirname "$0")"

CACHE=${GPUSHARE_TOOLS_CACHE:-$HOME/.cache/gpushare-tools}
VERSION=$(cat go.mod go.sum ./*.go | sha256sum | cut -c1-12)
DIR="$CACHE/apiclient-$VERSION"
BIN="$DIR/apiclient"

if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    echo "the API server client double cannot be built: the Go toolchain (go) is not on PATH; install Go 1.24 or newer." >&2
    exit 3
fi

echo "Building the API server client double (bench/apiclient, k8s.io/apiserver) into $DIR (once) ..." >&2
mkdir -p "$DIR"
partial="$DIR/apiclient.partial.$$"
trap 'rm -f "$partial"' EXIT
CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -o "$partial" .
mv "$partial" "$BIN"
echo "$BIN"

#!/usr/bin/env bash
# Build the Helm client from its Go module, once, into a versioned cache folder, and print the binary's path.
#   charts/build-helm.sh            -> /root/.cache/gpushare-tools/helm-v3.19.5/helm (built on the first call)
# Used by ./dev (the `helm` command and the tests) and by the real-cluster tier. Exit 3 with one line on stderr
# when Go is missing; any other failure exits 1 with the build's output.
#   GPUSHARE_HELM_VERSION   the helm.sh/helm/v3 version to build (default below)
#   GPUSHARE_TOOLS_CACHE    the cache folder (default ~/.cache/gpushare-tools)
set -euo pipefail

VERSION=${GPUSHARE_HELM_VERSION:-v3.19.5}
CACHE=${GPUSHARE_TOOLS_CACHE:-$HOME/.cache/gpushare-tools}
DIR="$CACHE/helm-$VERSION"
BIN="$DIR/helm"

if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    echo "helm cannot be built: the Go toolchain (go) is not on PATH; install Go 1.24 or newer." >&2
    exit 3
fi

echo "Building helm $VERSION from its Go module into $DIR (once; a few minutes) ..." >&2
module=$(go mod download -json "helm.sh/helm/v3@$VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
if [ -z "$module" ] || [ ! -d "$module" ]; then
    echo "helm cannot be built: downloading the module helm.sh/helm/v3@$VERSION failed." >&2
    exit 1
fi
# The version stamps of helm's own Makefile: without them `helm version` reports no version, and `helm template`
# and `helm lint` assume Kubernetes 1.20 (chartutil's default) instead of the client-go release helm is built with
# (client-go v0.N.x is Kubernetes 1.N).
client_go=$(cd "$module" && go list -f '{{.Version}}' -m k8s.io/client-go)
k8s_minor=$(echo "$client_go" | cut -d. -f2)
ldflags="-w -s -X helm.sh/helm/v3/internal/version.version=$VERSION -X helm.sh/helm/v3/internal/version.metadata="
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done

mkdir -p "$DIR"
partial="$DIR/helm.partial.$$"
trap 'rm -f "$partial"' EXIT
(cd "$module" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "$ldflags" -o "$partial" ./cmd/helm)
mv "$partial" "$BIN"
echo "Built $("$BIN" version --short)." >&2
echo "$BIN"

#!/usr/bin/env bash
# Build the Helm client from its Go module, once, into a versioned cache folder, and print the binary's path.
#   charts/build-helm.sh                                -> ~/.cache/gpushare-tools/helm-v4.3.2/helm (built on the first call)
#   GPUSHARE_HELM_VERSION=v3.19.5 charts/build-helm.sh  -> ~/.cache/gpushare-tools/helm-v3.19.5/helm
# Used by ./dev (the `helm` command and the tests) and by the real-cluster tier. Exit 3 with one line on stderr
# when Go is missing; any other failure exits 1 with the build's output.
#   GPUSHARE_HELM_VERSION   the helm release to build, v4.x (module helm.sh/helm/v4) or v3.x (helm.sh/helm/v3)
#   GPUSHARE_TOOLS_CACHE    the cache folder (default ~/.cache/gpushare-tools)
set -euo pipefail

VERSION=${GPUSHARE_HELM_VERSION:-v4.3.2}
CACHE=${GPUSHARE_TOOLS_CACHE:-$HOME/.cache/gpushare-tools}
DIR="$CACHE/helm-$VERSION"
BIN="$DIR/helm"

if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
major=${VERSION%%.*}
if [ "$major" != v3 ] && [ "$major" != v4 ]; then
    echo "helm cannot be built: GPUSHARE_HELM_VERSION=$VERSION is not a helm v3.x or v4.x release (e.g. v4.3.2)." >&2
    exit 1
fi
if ! command -v go >/dev/null 2>&1; then
    echo "helm cannot be built: the Go toolchain (go) is not on PATH; install Go 1.26 or newer (1.24 for helm v3)." >&2
    exit 3
fi

MODULE="helm.sh/helm/$major"
echo "Building helm $VERSION from its Go module into $DIR (once; a few minutes) ..." >&2
module=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
if [ -z "$module" ] || [ ! -d "$module" ]; then
    echo "helm cannot be built: downloading the module $MODULE@$VERSION failed." >&2
    exit 1
fi
# The version stamps of helm's own Makefile (LDFLAGS): without them `helm version` reports no version.
ldflags="-w -s -X $MODULE/internal/version.version=$VERSION -X $MODULE/internal/version.metadata="
ldflags+=" -X $MODULE/internal/version.gitTreeState=clean"
if [ "$major" = v3 ]; then
    # Helm 3 also stamps the Kubernetes release its client-go is (v0.N.x is Kubernetes 1.N) into two packages'
    # k8sVersionMajor/Minor (v3 Makefile, K8S_MODULES_VER; pkg/chartutil/capabilities.go and
    # pkg/lint/rules/deprecations.go): without them `helm template` and `helm lint` assume Kubernetes 1.20.
    client_go=$(cd "$module" && go list -f '{{.Version}}' -m k8s.io/client-go)
    k8s_minor=$(echo "$client_go" | cut -d. -f2)
    for pkg in "$MODULE/pkg/lint/rules" "$MODULE/pkg/chartutil"; do
        ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
    done
fi
# Helm 4 stamps nothing more (v4.3.2 Makefile): it reads client-go's version from the binary's own build
# information at run time (internal/version/clientgo.go K8sIOClientGoModVersion, used by
# pkg/chart/common/capabilities.go makeDefaultCapabilities), which `go build` of the module records.

mkdir -p "$DIR"
partial="$DIR/helm.partial.$$"
trap 'rm -f "$partial"' EXIT
(cd "$module" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "$ldflags" -o "$partial" ./cmd/helm)
mv "$partial" "$BIN"
echo "Built $("$BIN" version --short)." >&2
echo "$BIN"

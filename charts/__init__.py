"""The Helm chart's generator: charts/gpushare is built from the kustomize manifests, never edited by hand."""

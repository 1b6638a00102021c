"""What only the chart adds to the manifests' objects: the labels of the Helm release on every object and pod
template, a hash of the ConfigMap on the pod templates that read it, and the refusal of a release namespace that
the chart creates itself."""

from __future__ import annotations

from typing import Any

from charts.knobs import CONFIG_CHECKSUM, CONFIG_MAP, HELM_LABELS, MANIFEST_LABELS
from charts.model import ModelError, Part, Splice, When

LABELS = "gpushare.labels"
CHECKSUM = "gpushare.configChecksum"


def _plain(node: Any) -> Any:
    return node.value if isinstance(node, When) else node


def pod_template(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod template of a workload (Deployment, DaemonSet, Job), or None."""
    spec = _plain(obj.get("spec"))
    template = _plain(spec.get("template")) if isinstance(spec, dict) else None
    if isinstance(template, dict) and isinstance(_plain(template.get("spec")), dict):
        return template
    return None


def _reads_config(template: dict[str, Any]) -> bool:
    containers = _plain(_plain(template["spec"]).get("containers")) or []
    return any((_plain(source).get("configMapRef") or {}).get("name") == CONFIG_MAP
               for container in containers for source in _plain(_plain(container).get("envFrom")) or [])


def _map(metadata: dict[str, Any], field: str, where: str) -> dict[str, Any]:
    entries = metadata.setdefault(field, {})
    if not isinstance(entries, dict):
        raise ModelError(f"{where} has {field} that differ between the renders; the chart adds its own {field} "
                         "there, so give them one value in the manifests.")
    return entries


def add_release_fields(parts: list[Part]) -> None:
    """The release's labels on every object and pod template; the config checksum on the pod templates of the
    workloads that read the ConfigMap CONFIG_MAP with envFrom."""
    readers = 0
    for part in parts:
        where = f"{part.obj['kind']} {part.obj['metadata']['name']}"
        labels = _map(part.obj["metadata"], "labels", where)
        missing = [label for label in MANIFEST_LABELS if label not in labels]
        if missing:
            raise ModelError(f"{where} lacks the labels {missing} in the manifests; every object names its "
                             "app.kubernetes.io/name and component, and its kustomization adds part-of.")
        labels["<release labels>"] = Splice(LABELS)
        template = pod_template(part.obj)
        if template is None:
            continue
        metadata = template.setdefault("metadata", {})
        _map(metadata, "labels", f"{where}'s pod template")["<release labels>"] = Splice(LABELS)
        if _reads_config(template):
            _map(metadata, "annotations", f"{where}'s pod template")["<config checksum>"] = Splice(CHECKSUM)
            readers += 1
    if not readers:
        raise ModelError(f"No workload reads the ConfigMap {CONFIG_MAP} with envFrom, which the chart's "
                         f"{CONFIG_CHECKSUM} annotation hashes; fix CONFIG_MAP in charts/knobs.py.")


HELPERS = """\
{{{{/*
The labels of the Helm release on every object and pod template, besides the manifests' own
({manifest}).
*/}}}}
{{{{- define "{labels}" -}}}}
{entries}
{{{{- end -}}}}
{{{{/*
{annotation}: a hash of the data of the ConfigMap {config} as this release renders it, on the pod templates of the
workloads that read it with envFrom, so that `helm upgrade` with another config.* value rolls their pods.
*/}}}}
{{{{- define "{checksum}" -}}}}
{{{{- $config := include (print .Template.BasePath "/{template}") . | fromYaml -}}}}
{annotation}: {{{{ toYaml $config.data | sha256sum | quote }}}}
{{{{- end -}}}}
"""


def helpers(config_template: str) -> str:
    """The named templates of the release's labels and of the config checksum (`config_template`: the template
    file, inside templates/, that holds the ConfigMap alone)."""
    entries = "\n".join(f"{label}: {expression}" for label, expression in HELM_LABELS.items())
    return HELPERS.format(manifest=", ".join(MANIFEST_LABELS), labels=LABELS, entries=entries,
                          annotation=CONFIG_CHECKSUM, config=CONFIG_MAP, checksum=CHECKSUM, template=config_template)


def namespace_unless_release(namespace: str, doc: str) -> str:
    """The chart's Namespace `doc`, rendered unless the release itself lives in `namespace`: then Helm made it
    (`helm install -n {namespace} --create-namespace`, as users type it) before rendering, and would refuse the
    chart's Namespace as an object it does not own (Helm's ownership check, pkg/action/validate.go). Helm creates it
    without the Pod Security labels; NOTES.txt says how to add them where the cluster's default level is not
    privileged."""
    return f'{{{{- if ne .Release.Namespace "{namespace}" }}}}\n{doc}{{{{- end }}}}\n'

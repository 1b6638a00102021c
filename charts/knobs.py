"""The chart's values: which fields of the rendered manifests each value sets, and what it means.

A value's default is read from the manifests themselves (the field it replaces), so the chart with its default
values renders exactly the objects of the overlays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

CERT_MANAGER, SELF_SIGNED = "cert-manager", "self-signed"
# The value that picks the overlay, and the overlay each choice renders.
MODE_VALUE = "certificates"
MODES = {CERT_MANAGER: "cert-manager", SELF_SIGNED: "self-signed"}
MODE_DOC = ("Where the webhook's serving certificate and the intent-signing key come from: cert-manager (its "
            "Issuers and Certificates, and a Job for the signing key; cert-manager must be installed) or self-signed "
            "(run `gpushare-certs install --namespace gpushare-system` after installing; see docs/helm.md). "
            "The same objects as manifests/cert-manager and manifests/self-signed.")


@dataclass(frozen=True)
class Where:
    """Fields of rendered objects: kind, name (`*` for any) and a path such as
    `spec.template.spec.containers[name=webhook].resources` (`[*]` every item, `[0]` the first; a name in brackets
    may hold dots: `webhooks[name=neutralise.gpushare.io]`)."""

    kind: str
    name: str
    path: str


@dataclass(frozen=True)
class Value:
    path: str  # in values.yaml, dotted; a path without a dot is a top-level value
    doc: str
    enum: tuple[str, ...] = ()
    items: Mapping[str, Any] = field(default_factory=dict)  # of a list value: the JSON Schema of each item
    schema: Mapping[str, Any] = field(default_factory=dict)  # further JSON Schema keywords of the value


def _one(value: Any) -> tuple[Any, ...]:
    return (value,)


def image_defaults(image: Any) -> tuple[Any, ...]:
    """The manifests' image -> the defaults of image.repository, image.tag and image.digest (none: the tag)."""
    return (*split_image(image), "")


def split_image(image: Any) -> tuple[Any, ...]:
    """`registry:5000/gpushare:0.1.0` -> (`registry:5000/gpushare`, `0.1.0`); a colon before the last `/` is a port."""
    text = str(image)
    name, sep, tag = text.rpartition(":")
    if not sep or "/" in tag:
        raise ValueError(f"the manifests' image {text!r} has no tag; give it one in the overlay's images: entry")
    return name, tag


@dataclass(frozen=True)
class Knob:
    """One or more values that together set the fields `where` (all of which hold the same value in the
    manifests). `block` fields are maps or lists written with toYaml; the others are scalars. An `append` knob adds
    the items of its value (a list, empty by default) after the items the manifests hold in the list `where`; with
    `keep`, after their first `keep` items only: the manifests' items after those are the value's default, so the
    value replaces them (and an empty list removes them). An `append` knob on a map adds the value's entries (a
    map, empty by default) to the manifests'. An `absent` knob sets a field the manifests lack (the last step of
    `where`): its value's default is `absent` (an empty map or list), and the field is rendered only while the
    value is not empty."""

    where: tuple[Where, ...]
    values: tuple[Value, ...]
    expression: str = ""  # a Helm action for the field; empty: the single value itself
    block: bool = False
    append: bool = False
    keep: int | None = None
    defaults: Callable[[Any], tuple[Any, ...]] = field(default=_one)
    absent: dict[str, Any] | list[Any] | None = None


CONTAINERS = "spec.template.spec.containers[*]"
WEBHOOK = "spec.template.spec.containers[name=webhook]"
PLUGIN = "spec.template.spec.containers[name=device-plugin]"
DRA = "spec.template.spec.containers[name=dra-plugin]"
POD = "spec.template"

# The labels every object and pod template carries (Kubernetes' recommended labels, docs/helm.md): the manifests
# write name, component and part-of; the chart adds the others (the named template gpushare.labels). Label values
# are 63 characters at most, alphanumeric at both ends (kube-apiserver's IsValidLabelValue): Helm's expressions
# replace the `+` of a SemVer build and cut at 63.
MANIFEST_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of")
_LABEL = 'replace "+" "_" | trunc 63 | trimSuffix "-" | quote'
HELM_LABELS = {
    "app.kubernetes.io/instance": f"{{{{ .Release.Name | {_LABEL} }}}}",
    "app.kubernetes.io/version": f"{{{{ .Chart.AppVersion | {_LABEL} }}}}",
    "app.kubernetes.io/managed-by": f"{{{{ .Release.Service | {_LABEL} }}}}",
    "helm.sh/chart": f'{{{{ printf "%s-%s" .Chart.Name .Chart.Version | {_LABEL} }}}}',
}
# The ConfigMap the workloads read with envFrom, and the pod-template annotation that holds a hash of its data, so
# that `helm upgrade` with another config.* value rolls their pods (the kubelet does not refresh envFrom).
CONFIG_MAP = "gpushare-config"
CONFIG_CHECKSUM = "checksum/config"

LABEL_VALUE = {"type": "string", "maxLength": 63, "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}
# A pod label may not be one of the standard labels (the schema's `false` refuses the key, naming it): the
# selectors use app.kubernetes.io/name, and a second entry for one of the others would be a duplicate key.
POD_LABELS = {"additionalProperties": LABEL_VALUE,
              "properties": {label: False for label in (*MANIFEST_LABELS, *HELM_LABELS)}}
POD_ANNOTATIONS = {"additionalProperties": {"type": "string"}, "properties": {CONFIG_CHECKSUM: False}}
# A PriorityClass name (DNS subdomain), or empty for none.
PRIORITY_CLASS = {"maxLength": 253, "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"}
LOCAL_OBJECT_REFERENCE = {"type": "object", "required": ["name"], "additionalProperties": False,
                          "properties": {"name": {"type": "string", "minLength": 1}}}
# An OCI content digest (image-spec descriptor.md: the registered algorithms), or empty for the tag.
DIGEST = {"pattern": "^(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})?$"}


def pod_knobs(head: str, kind: str, name: str, what: str, *, affinity: bool, placement: bool) -> tuple[Knob, ...]:
    """The values of a workload's pod template: its PriorityClass, annotations and labels added to its own (the
    selector keeps its one label), its affinity (`affinity`: the manifests set one, the value's default) and, where
    the manifests set none (`placement` false), its node selector and tolerations."""
    def where(path: str) -> tuple[Where, ...]:
        return (Where(kind, name, f"{POD}.{path}"),)

    knobs = [
        Knob(where=where("spec.priorityClassName"),
             values=(Value(f"{head}.priorityClassName", f"The PriorityClass of {what}'s pods; empty for none.",
                           schema=PRIORITY_CLASS),)),
        Knob(where=where("metadata.annotations"),
             values=(Value(f"{head}.podAnnotations", f"Annotations added to {what}'s pods.",
                           schema=POD_ANNOTATIONS),), block=True, append=True),
        Knob(where=where("metadata.labels"),
             values=(Value(f"{head}.podLabels", f"Labels added to {what}'s pods (never to its selector, which an "
                           "upgrade cannot change); not one of the standard app.kubernetes.io labels.",
                           schema=POD_LABELS),), block=True, append=True),
        Knob(where=where("spec.affinity"),
             values=(Value(f"{head}.affinity", f"The affinity of {what}'s pods (an Affinity)."),), block=True,
             absent=None if affinity else {}),
    ]
    if not placement:
        knobs += [
            Knob(where=where("spec.nodeSelector"),
                 values=(Value(f"{head}.nodeSelector", f"The nodes that may run {what} (node labels)."),),
                 block=True, absent={}),
            Knob(where=where("spec.tolerations"),
                 values=(Value(f"{head}.tolerations", f"Taints {what}'s pods tolerate (a list of Toleration)."),),
                 block=True, absent=[]),
        ]
    return tuple(knobs)


def node_plugin_knobs(head: str, daemonset: str, container: str, what: str, nodes: str) -> tuple[Knob, ...]:
    """The values of a node plugin's DaemonSet (the device plugin's, the DRA driver's): where it runs, its
    resources, and env entries, mounts and volumes added to its own (the way to give it an NVML library your nodes
    provide another way, or the real-cluster tier's fake one)."""
    pod = "spec.template.spec"
    return (
        Knob(where=(Where("DaemonSet", daemonset, f"{pod}.nodeSelector"),),
             values=(Value(f"{head}.nodeSelector", nodes),), block=True),
        Knob(where=(Where("DaemonSet", daemonset, f"{pod}.tolerations"),),
             values=(Value(f"{head}.tolerations", f"Taints of GPU nodes {what} tolerates."),), block=True),
        Knob(where=(Where("DaemonSet", daemonset, f"{container}.resources"),),
             values=(Value(f"{head}.resources", f"The resource requests and limits of {what}'s container."),),
             block=True),
        Knob(where=(Where("DaemonSet", daemonset, f"{container}.env"),),
             values=(Value(f"{head}.extraEnv", f"Environment variables added to {what} container's (a list of "
                           "EnvVar), for example to point it at an NVML library your nodes provide another way."),),
             block=True, append=True),
        Knob(where=(Where("DaemonSet", daemonset, f"{container}.volumeMounts"),),
             values=(Value(f"{head}.extraVolumeMounts", f"Volume mounts added to {what} container's (a list of "
                           f"VolumeMount), of volumes in {head}.extraVolumes."),), block=True, append=True),
        Knob(where=(Where("DaemonSet", daemonset, f"{pod}.volumes"),),
             values=(Value(f"{head}.extraVolumes", f"Volumes added to {what} pod's (a list of Volume)."),),
             block=True, append=True),
    )


def comma_list(text: Any) -> tuple[Any, ...]:
    """`a,b` -> ([a, b],); empty -> ([],)."""
    return ([part.strip() for part in str(text).split(",") if part.strip()],)


# An IPv4 or IPv6 network in CIDR notation (the webhook checks it exactly at start: webhook/server/sourcefilter.py).
CIDR = {"type": "string", "pattern": "^[0-9A-Fa-f.:]+(/[0-9]{1,3})?$", "maxLength": 43}
# A namespace name (DNS-1123 label, as kube-apiserver validates it).
DNS_LABEL = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
# The namespaces the rules for ordinary pods (no GPU selection by env without GPU memory) leave out: the fail-open
# webhook entries, the policy gpushare-container-env and, in-process, the MutatingAdmissionPolicy
# gpushare-neutralise. Each list holds gpushare-system first, always left out (the webhook and the plugins must start
# while the webhook is down), then the trusted namespaces, which the value sets.
EXEMPT = "namespaceSelector.matchExpressions[key=kubernetes.io/metadata.name].values"
TRUSTED_NAMESPACES = Knob(
    where=(Where("MutatingWebhookConfiguration", "gpushare-webhook", f"webhooks[name=neutralise.gpushare.io].{EXEMPT}"),
           Where("ValidatingWebhookConfiguration", "gpushare-webhook",
                 f"webhooks[name=validate-ordinary.gpushare.io].{EXEMPT}"),
           Where("ValidatingAdmissionPolicy", "gpushare-container-env", f"spec.matchConstraints.{EXEMPT}"),
           Where("MutatingAdmissionPolicy", "gpushare-neutralise", f"spec.matchConstraints.{EXEMPT}")),
    values=(Value("trustedNamespaces", "Namespaces whose pods may select GPUs by env (NVIDIA_VISIBLE_DEVICES, "
                  "CUDA_VISIBLE_DEVICES, ...) without requesting aliyun.com/gpu-mem, such as the NVIDIA device "
                  "plugin's: the rules for ordinary pods (the webhook entries neutralise.gpushare.io and "
                  "validate-ordinary.gpushare.io, or in-process the policy gpushare-neutralise, and the policy "
                  "gpushare-container-env) leave them out; GPU-share pods are checked there as everywhere. Whoever "
                  "can create pods in one can give a container every GPU of a node: list only namespaces where only "
                  "cluster administrators create pods. gpushare-system is always left out. See docs/deploy.md, "
                  "Trusted GPU infrastructure.", items=DNS_LABEL),),
    block=True, append=True, keep=1,
)

KNOBS: tuple[Knob, ...] = (
    TRUSTED_NAMESPACES,
    Knob(
        where=(Where("*", "*", f"{CONTAINERS}.image"),),
        values=(Value("image.repository", "The image all workloads run (see Dockerfile), without its tag."),
                Value("image.tag", "Its tag."),
                Value("image.digest", "Its digest (sha256:...): when set, the workloads run repository@digest "
                      "and the tag is not used.", schema=DIGEST)),
        expression='{{ if .Values.image.digest }}{{ printf "%s@%s" .Values.image.repository .Values.image.digest '
                   '| quote }}{{ else }}{{ printf "%s:%s" .Values.image.repository (toString .Values.image.tag) '
                   '| quote }}{{ end }}',
        defaults=image_defaults,
    ),
    Knob(
        where=(Where("*", "*", f"{POD}.spec.imagePullSecrets"),),
        values=(Value("imagePullSecrets", "Secrets the kubelet pulls the image with, for every pod of the chart "
                      "(a list of LocalObjectReference: name).", items=LOCAL_OBJECT_REFERENCE),),
        block=True, absent=[],
    ),
    Knob(
        where=(Where("*", "*", f"{CONTAINERS}.imagePullPolicy"),),
        values=(Value("image.pullPolicy", "When the kubelet pulls the image.", ("Always", "IfNotPresent", "Never")),),
    ),
    Knob(
        where=(Where("ConfigMap", "gpushare-config", "data.GPUSHARE_DELIVERY"),),
        values=(Value("config.delivery", "How a container gets its GPU: env (downward-API env, needs the scheduler "
                      "extender) or cdi (CDI devices written by the plugin). See docs/deploy.md, Settings.",
                      ("env", "cdi")),),
    ),
    Knob(
        where=(Where("ConfigMap", "gpushare-config", "data.GPUSHARE_PLACEMENT"),),
        values=(Value("config.placement", "Who picks the GPU: the scheduler extender (extender), or the device "
                      "plugin on the node (node, cdi delivery only). The webhook and the plugins read it.",
                      ("extender", "node")),),
    ),
    Knob(
        where=(Where("ConfigMap", "gpushare-config", "data.GPUSHARE_UNIT"),),
        values=(Value("config.unit", "One device of the resource per GiB or per MiB of GPU memory.",
                      ("GiB", "MiB")),),
    ),
    Knob(
        where=(Where("ConfigMap", "gpushare-config", "data.GPUSHARE_LOG_LEVEL"),),
        values=(Value("config.logLevel", "Log level of the webhook and the plugins.",
                      ("DEBUG", "INFO", "WARNING", "ERROR")),),
    ),
    Knob(
        where=(Where("Deployment", "gpushare-webhook", "spec.replicas"),),
        values=(Value("webhook.replicas", "Webhook replicas; keep two or more (the PodDisruptionBudget keeps one "
                      "available)."),),
    ),
    Knob(
        where=(Where("Deployment", "gpushare-webhook", f"{WEBHOOK}.resources"),),
        values=(Value("webhook.resources", "The webhook container's resource requests and limits."),),
        block=True,
    ),
    *pod_knobs("webhook", "Deployment", "gpushare-webhook", "the webhook", affinity=True, placement=False),
    *node_plugin_knobs("devicePlugin", "gpushare-device-plugin", PLUGIN, "the device plugin",
                       "The nodes that run the device plugin (label your GPU nodes "
                       "gpushare.io/gpu-memory=device-plugin)."),
    *pod_knobs("devicePlugin", "DaemonSet", "gpushare-device-plugin", "the device plugin", affinity=False,
               placement=True),
    *node_plugin_knobs("dra", "gpushare-dra-plugin", DRA, "the DRA driver",
                       "The nodes that run the DRA driver. A node serves GPU memory through one path, the value of "
                       "its label gpushare.io/gpu-memory: device-plugin for the device plugin, dra for the driver."),
    *pod_knobs("dra", "DaemonSet", "gpushare-dra-plugin", "the DRA driver", affinity=False, placement=True),
    Knob(
        where=(Where("Deployment", "gpushare-webhook", f"{WEBHOOK}.env[name=GPUSHARE_ADMISSION_SOURCES].value"),),
        values=(Value("webhook.admissionSources", "The API server's source addresses, as CIDRs: the kernel drops "
                      "connections to the webhook's admission port from anywhere else, whatever the network plugin "
                      "(GPUSHARE_ADMISSION_SOURCES). Empty admits every source, and the webhook's /readyz and log say "
                      "so; docs/deploy.md, Network policy, says how to find yours.", items=CIDR),),
        expression='{{ join "," .Values.webhook.admissionSources | quote }}',
        defaults=comma_list,
    ),
    Knob(
        where=(Where("NetworkPolicy", "gpushare-webhook", "spec.ingress[0].from"),),
        values=(Value("networkPolicy.apiServer", "Who may reach the webhook's admission port (8443): the API "
                      "server's source addresses, as NetworkPolicyPeers (an ipBlock per range). Empty admits every "
                      "source; docs/deploy.md, Network policy, says how to find yours."),),
        block=True,
    ),
    Knob(
        where=(Where("NetworkPolicy", "gpushare-webhook", "spec.ingress[1].from"),
               Where("NetworkPolicy", "gpushare-device-plugin", "spec.ingress[0].from"),
               Where("NetworkPolicy", "gpushare-dra-plugin", "spec.ingress[0].from")),
        values=(Value("networkPolicy.metrics", "Who may reach the metrics ports (9102 of the webhook, 9103 of the "
                      "device plugin and the DRA driver): your monitoring stack, as NetworkPolicyPeers (a "
                      "namespaceSelector of its namespace). Empty admits every source."),),
        block=True,
    ),
)


@dataclass(frozen=True)
class Switch:
    """Every object of `kind` in the base, kept while the chart value `value` (on by default) is true."""

    value: str
    kind: str
    doc: str


SWITCHES = (
    Switch("networkPolicy.enabled", "NetworkPolicy", "Install the NetworkPolicies of "
           "manifests/base/network-policy.yaml, and with dra.enabled the DRA driver's (who may reach the webhook's "
           "and the node plugins' ports); they act only where the network plugin enforces NetworkPolicy."),
)

@dataclass(frozen=True)
class Gate:
    """Every object of `kinds` (of the base or of a component) rendered only while `condition`, a Helm expression
    over other values, holds: what an operator of the overlays does with a patch that deletes them (`why`)."""

    kinds: tuple[str, ...]
    condition: str
    why: str


GATES = (
    Gate(("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"), 'eq .Values.config.delivery "env"',
         "the policy gpushare-neutralise adds NVIDIA_VISIBLE_DEVICES=void, which only env delivery does; in cdi "
         "delivery the webhook adds nothing to ordinary pods"),
)

# The optional components of manifests/ (folder -> what its switch means); the chart's value is
# `<camelCase folder>.enabled`, off by default, as a component is until an overlay lists it.
COMPONENT_DOCS = {
    "monitoring": "Prometheus Operator PodMonitors for the webhook and the device plugins, their alerts (a "
                  "PrometheusRule, docs/troubleshooting.md), and the Grafana dashboard as a ConfigMap (needs the "
                  "monitoring.coreos.com CRDs).",
    "dra": "The DRA driver: its DaemonSet on nodes labelled gpushare.io/gpu-memory=dra, its ServiceAccount and "
           "RBAC, the DeviceClass gpushare.io and the policies keeping it to its own node's ResourceSlices (needs "
           "resource.k8s.io/v1 and the DRAConsumableCapacity feature gate; docs/dra.md).",
    "in-process": "Ordinary pods (no aliyun.com/gpu-mem, no reserved annotation) are handled inside the API server: "
                  "the MutatingAdmissionPolicy gpushare-neutralise adds NVIDIA_VISIBLE_DEVICES=void (env delivery) "
                  "and the webhook entries neutralise.gpushare.io and validate-ordinary.gpushare.io are left out "
                  "(the policy gpushare-container-env checks those pods' env). auto: on where the cluster serves "
                  "admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (Kubernetes 1.36 or newer; `helm "
                  "template` needs --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy); true "
                  "or false overrides. See docs/deploy.md, Ordinary pods inside the API server.",
}
# Components the chart adds by itself where the cluster serves an API (folder -> the API as Helm's
# .Capabilities.APIVersions names it, group/version/Kind: discovery at install and upgrade, --api-versions for
# `helm template`). Their value `<camelCase folder>.enabled` is `auto` by default; true or false overrides it.
CAPABILITIES = {"in-process": "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"}
AUTO = "auto"


def component_value(folder: str) -> str:
    head, *rest = folder.split("-")
    return head + "".join(word.capitalize() for word in rest)

"""The API server adapter of gpushare-certs: Secrets, ConfigMaps, a namespace and the webhook configurations.

The only module of `certs` that imports the `kubernetes` client. Objects travel as plain JSON through the
client's REST layer; every failure becomes a ClusterError whose text says what failed and what to do.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Protocol

from certs.plan import LABELS, Stored, WebhookConfiguration

CONFIGURATION_PATHS = {
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}
PERMISSIONS_HINT = (
    "gpushare-certs needs, as an administrator: get/create namespaces; get/create/update secrets and configmaps "
    "in the webhook's namespace; get/patch mutatingwebhookconfigurations and validatingwebhookconfigurations "
    "(see docs/deploy.md)"
)


class ClusterError(RuntimeError):
    """The API server could not be reached, refused the credentials, or refused an operation."""


class Cluster(Protocol):
    """What install and rotate need from the API server (tests provide an in-memory one)."""

    def ensure_namespace(self, name: str) -> bool: ...
    def read_secret(self, namespace: str, name: str) -> Stored | None: ...
    def write_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], secret_type: str, previous: Stored | None
    ) -> None: ...
    def read_configmap(self, namespace: str, name: str) -> Stored | None: ...
    def write_configmap(
        self, namespace: str, name: str, data: Mapping[str, bytes], previous: Stored | None
    ) -> None: ...
    def read_configuration(self, kind: str, name: str) -> WebhookConfiguration | None: ...
    def set_ca_bundle(self, config: WebhookConfiguration, bundle: bytes) -> None: ...


def configuration_from(obj: Mapping[str, Any]) -> WebhookConfiguration:
    bundles = []
    for hook in obj.get("webhooks") or []:
        raw = (hook.get("clientConfig") or {}).get("caBundle") or ""
        try:
            bundles.append((str(hook.get("name", "")), base64.b64decode(raw)))
        except (binascii.Error, ValueError):
            bundles.append((str(hook.get("name", "")), b""))
    meta = obj.get("metadata") or {}
    return WebhookConfiguration(
        kind=str(obj.get("kind", "")), name=str(meta.get("name", "")),
        annotations=dict(meta.get("annotations") or {}), ca_bundles=tuple(bundles),
    )


def ca_bundle_patch(config: WebhookConfiguration, bundle: bytes) -> list[dict[str, Any]]:
    """A JSON patch that sets caBundle on every webhook, refused (422) if the list changed meanwhile."""
    encoded = base64.b64encode(bundle).decode()
    ops: list[dict[str, Any]] = []
    for index, (name, _) in enumerate(config.ca_bundles):
        ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": name})
        ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded})
    return ops


def _object(kind: str, namespace: str, name: str, data: Mapping[str, bytes], previous: Stored | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(LABELS)}
    if previous is not None:
        meta["resourceVersion"] = previous.resource_version  # a concurrent change gives 409, not a lost update
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": meta}
    if kind == "Secret":
        obj["data"] = {k: base64.b64encode(v).decode() for k, v in data.items()}
    else:
        obj["data"] = {k: v.decode() for k, v in data.items()}
    return obj


class KubeCluster:
    """Cluster over the kubernetes client, from a kubeconfig file or the pod's in-cluster credentials."""

    def __init__(self, kubeconfig: str | None, context: str | None, in_cluster: bool, timeout: float = 15.0) -> None:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
        from yaml import YAMLError

        configuration = client.Configuration()
        try:
            if in_cluster:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                self.where = "the in-cluster API server"
            else:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=kubeconfig, context=context, client_configuration=configuration, persist_config=False
                )
                self.where = f"the API server at {configuration.host}"
        except (ConfigException, OSError, ValueError, YAMLError) as exc:
            source = "the pod's service account" if in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
            raise ClusterError(
                f"Could not load cluster credentials from {source} ({exc}); pass --kubeconfig FILE (and --context) "
                "for a cluster you administer, or set KUBECONFIG."
            ) from exc
        configuration.retries = 1  # fail fast when the API server is down; the operator reruns the command
        self._api = client.ApiClient(configuration)
        self.timeout = timeout

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    # -- REST ------------------------------------------------------------------------------------------

    def _request(
        self, what: str, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any] | None:
        """The decoded answer; None for 404; ClusterError for anything else that is not a success."""
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            method, url, headers, body, _ = self._api.param_serialize(
                method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            response = self._api.call_api(method, url, headers, body, _request_timeout=self.timeout)
            raw = response.read()  # type: ignore[no-untyped-call]
        except ApiException as exc:
            raise ClusterError(self._unreachable(what, exc.reason)) from exc
        except Exception as exc:  # urllib3 wraps refused connections, DNS and TLS failures in several types
            raise ClusterError(self._unreachable(what, _root_cause(exc))) from exc
        status = int(response.status)
        if status == 404:
            return None
        if status >= 300:
            raise ClusterError(self._refused(what, status, raw))
        return json.loads(raw) if raw else {}

    def _unreachable(self, what: str, reason: object) -> str:
        return (
            f"Could not {what}: {self.where} did not answer ({reason}). Check that the cluster is running and that "
            "--kubeconfig/--context point at it, then run the command again; it resumes where it stopped."
        )

    def _refused(self, what: str, status: int, raw: bytes) -> str:
        try:
            message = str(json.loads(raw).get("message", ""))
        except (ValueError, AttributeError):
            message = raw.decode(errors="replace")[:300]
        if status == 401:
            return (f"Could not {what}: {self.where} rejected the credentials (401 Unauthorized). Log in again or "
                    "pass --kubeconfig/--context for a user of this cluster.")
        if status == 403:
            return f"Could not {what}: permission denied (403 Forbidden: {message}). {PERMISSIONS_HINT}."
        if status == 409:
            return (f"Could not {what}: it was changed by someone else meanwhile (409 Conflict). Run the command "
                    "again; it reads the current state first.")
        return f"Could not {what}: {self.where} answered {status} ({message}); fix the cause and run the command again."

    # -- Cluster ---------------------------------------------------------------------------------------

    def ensure_namespace(self, name: str) -> bool:
        if self._request(f"read namespace {name}", "GET", f"/api/v1/namespaces/{name}") is not None:
            return False
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self._request(f"create namespace {name}", "POST", "/api/v1/namespaces", body)
        return True

    def _read(self, plural: str, namespace: str, name: str, decode_values: bool) -> Stored | None:
        what = f"read {plural[:-1]} {namespace}/{name}"
        obj = self._request(what, "GET", f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        if obj is None:
            return None
        data: dict[str, bytes] = {}
        for key, value in (obj.get("data") or {}).items():
            try:
                data[key] = base64.b64decode(value) if decode_values else str(value).encode()
            except (binascii.Error, ValueError) as exc:
                raise ClusterError(f"Could not {what}: its key {key} is not base64 ({exc}).") from exc
        return Stored(data, str((obj.get("metadata") or {}).get("resourceVersion", "")))

    def _write(self, plural: str, obj: dict[str, Any], previous: Stored | None) -> None:
        meta = obj["metadata"]
        base = f"/api/v1/namespaces/{meta['namespace']}/{plural}"
        if previous is None:
            self._request(f"create {plural[:-1]} {meta['namespace']}/{meta['name']}", "POST", base, obj)
        else:
            what = f"update {plural[:-1]} {meta['namespace']}/{meta['name']}"
            self._request(what, "PUT", f"{base}/{meta['name']}", obj)

    def read_secret(self, namespace: str, name: str) -> Stored | None:
        return self._read("secrets", namespace, name, decode_values=True)

    def write_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], secret_type: str, previous: Stored | None
    ) -> None:
        obj = _object("Secret", namespace, name, data, previous)
        obj["type"] = secret_type
        self._write("secrets", obj, previous)

    def read_configmap(self, namespace: str, name: str) -> Stored | None:
        return self._read("configmaps", namespace, name, decode_values=False)

    def write_configmap(self, namespace: str, name: str, data: Mapping[str, bytes], previous: Stored | None) -> None:
        self._write("configmaps", _object("ConfigMap", namespace, name, data, previous), previous)

    def read_configuration(self, kind: str, name: str) -> WebhookConfiguration | None:
        obj = self._request(f"read {kind} {name}", "GET", f"{CONFIGURATION_PATHS[kind]}/{name}")
        return None if obj is None else configuration_from(obj)

    def set_ca_bundle(self, config: WebhookConfiguration, bundle: bytes) -> None:
        patch = ca_bundle_patch(config, bundle)
        if patch:
            self._request(f"set the caBundle of {config.kind} {config.name}", "PATCH",
                          f"{CONFIGURATION_PATHS[config.kind]}/{config.name}", patch, "application/json-patch+json")


def _root_cause(exc: BaseException) -> str:
    """The innermost reason urllib3 gives (e.g. 'Connection refused'), not its retry wrapper."""
    seen = exc
    while True:
        inner = getattr(seen, "reason", None)
        if isinstance(inner, BaseException) and inner is not seen:
            seen = inner
            continue
        if seen.__cause__ is not None and seen.__cause__ is not seen:
            seen = seen.__cause__
            continue
        return str(seen) or type(seen).__name__

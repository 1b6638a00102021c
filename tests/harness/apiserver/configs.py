"""Webhook configurations from rendered manifests (`kubectl kustomize ...`), with caBundle filled in."""

from __future__ import annotations

import base64
import copy
import importlib
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.harness.apiserver.resources import MUTATING, VALIDATING

Obj = dict[str, Any]
KINDS = {MUTATING.kind: MUTATING.key, VALIDATING.kind: VALIDATING.key}


def webhook_configurations(objects: Iterable[Mapping[str, Any]], ca_pem: bytes | None) -> list[tuple[str, Obj]]:
    """(store key, configuration) for each webhook configuration among `objects`, in the order given.

    With `ca_pem`, every webhook's clientConfig.caBundle is set to it, which is what cert-manager's CA
    injector or the certs CLI does in a real cluster.
    """
    out: list[tuple[str, Obj]] = []
    for obj in objects:
        if not isinstance(obj, Mapping) or obj.get("apiVersion") != "admissionregistration.k8s.io/v1":
            continue
        key = KINDS.get(str(obj.get("kind")))
        if key is None:
            continue
        config = copy.deepcopy(dict(obj))
        if ca_pem is not None:
            bundle = base64.b64encode(ca_pem).decode()
            for hook in config.get("webhooks") or []:
                hook.setdefault("clientConfig", {})["caBundle"] = bundle
        out.append((key, config))
    return out


REPO = Path(__file__).resolve().parents[3]
OVERLAY = REPO / "manifests" / "self-signed"
BASE_ADMISSION = REPO / "manifests" / "base" / "admission.yaml"


def project_webhook_objects() -> list[Obj]:
    """The project's webhook configurations: the rendered self-signed overlay where kubectl is installed,
    else the base admission.yaml as written (the overlay does not change the configurations)."""
    if shutil.which("kubectl") is not None and OVERLAY.is_dir():
        return render_kustomize(OVERLAY)
    return load_yaml_documents(BASE_ADMISSION.read_text())


def render_kustomize(directory: Path | str) -> list[Obj]:
    """`kubectl kustomize DIR` parsed into objects; raises FileNotFoundError when kubectl is absent."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise FileNotFoundError("kubectl is not installed, so the manifests cannot be rendered")
    rendered = subprocess.run([kubectl, "kustomize", str(directory)], check=True, capture_output=True, text=True,
                              timeout=60).stdout
    return load_yaml_documents(rendered)


def load_yaml_documents(text: str) -> list[Obj]:
    # PyYAML ships with the kubernetes client; imported dynamically because its type stubs are not installed.
    yaml: Any = importlib.import_module("yaml")
    return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]

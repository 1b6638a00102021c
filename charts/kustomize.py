"""Render kustomize overlays and components with `kubectl kustomize`, each object tagged with its source file."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "manifests"
ORIGIN = "config.kubernetes.io/origin"

Obj = dict[str, Any]


class RenderError(Exception):
    """kubectl is missing or kustomize refused the manifests; the text says which and why."""


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        raise RenderError("kubectl is not on PATH, so the kustomize manifests cannot be rendered; install kubectl "
                          ">= 1.27 (./dev installs it into the virtual environment).")
    return path


def components() -> list[str]:
    """The optional components in manifests/ (folders whose kustomization is a `kind: Component`), sorted."""
    found = []
    for kustomization in sorted(MANIFESTS.glob("*/kustomization.yaml")):
        doc = yaml.safe_load(kustomization.read_text()) or {}
        if doc.get("kind") == "Component":
            found.append(kustomization.parent.name)
    return found


def render(overlay: str, parts: Sequence[str] = (), extra: Mapping[str, Any] | None = None,
           origins: bool = False, binary: str | None = None) -> list[Obj]:
    """The objects of manifests/<overlay> with the components `parts` added and the kustomization fields `extra`
    (images, replicas, patches ...) applied on top, as `kubectl apply -k` would send them: exactly a kustomization
    of those fields around the overlay. Such a kustomization does not give a component's workload the overlay's
    image (kustomize applies an overlay's `images:` only to its own objects); pass `overlay_images(overlay)` in
    `extra` for that, as docs/deploy.md tells users to repeat the entry.

    With `origins`, each object carries the manifest file it came from (relative to the repository) under
    metadata.annotations[ORIGIN]; use `origin()` to read and remove it. `binary`: the kubectl to run (default: the
    one on PATH).
    """
    with tempfile.TemporaryDirectory(prefix="gpushare-kustomize-") as tmp:
        here = Path(tmp)
        # kustomize refuses absolute paths to other kustomizations, but not relative ones that leave the root.
        kustomization: Obj = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(MANIFESTS / overlay, here)],
            "components": [os.path.relpath(MANIFESTS / p, here) for p in parts],
            **(extra or {}),
        }
        if origins:
            kustomization["buildMetadata"] = ["originAnnotations"]
        (here / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        done = subprocess.run([binary or kubectl(), "kustomize", str(here)], capture_output=True, text=True,
                              timeout=120, check=False)
    if done.returncode != 0:
        raise RenderError(f"kubectl kustomize of manifests/{overlay} with {list(parts)} failed: "
                          f"{done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def overlay_images(overlay: str) -> Obj:
    """The overlay's `images:` entry as kustomization fields (empty when it has none)."""
    doc = yaml.safe_load((MANIFESTS / overlay / "kustomization.yaml").read_text()) or {}
    return {"images": doc["images"]} if doc.get("images") else {}


def origin(obj: Obj) -> str:
    """Remove the origin annotation `render(..., origins=True)` added; returns the source path in the repository."""
    metadata = obj["metadata"]
    annotations = metadata.get("annotations", {})
    recorded = yaml.safe_load(annotations.pop(ORIGIN, "path: unknown"))
    if not annotations:
        metadata.pop("annotations", None)
    # The path is relative to the temporary kustomization; keep only what follows manifests/.
    # A generated object (configMapGenerator) records the kustomization that generated it instead of a path.
    path = str(recorded.get("path") or recorded.get("configuredIn") or "unknown")
    return "manifests/" + path.split("manifests/", 1)[1] if "manifests/" in path else path


def key(obj: Obj) -> tuple[str, str, str]:
    """What identifies an object in a cluster: kind, namespace and name."""
    metadata = obj["metadata"]
    return obj["kind"], metadata.get("namespace", ""), metadata["name"]

"""Render the kustomize overlays offline with `kubectl kustomize` and look objects up in the result."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from charts import kustomize

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"
DEPLOY_DOC = MANIFESTS.parent / "docs" / "deploy.md"
# A kustomization docs/deploy.md tells users to write beside the repository.
_DOC_OVERLAY = re.compile(r"```yaml\n(# my-gpushare/kustomization\.yaml\n.*?)```", re.S)
OVERLAYS = ("cert-manager", "self-signed")
NAMESPACE = "gpushare-system"

Obj = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed, so the kustomize overlays cannot be rendered; install kubectl >= 1.27")
    return path


@functools.cache
def _rendered(overlay: str) -> tuple[Obj, ...]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(MANIFESTS / overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"`kubectl kustomize manifests/{overlay}` failed: {done.stderr.strip()}")
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def docs_overlays() -> list[str]:
    """The text of every kustomization docs/deploy.md tells users to write (`my-gpushare/kustomization.yaml`)."""
    return _DOC_OVERLAY.findall(DEPLOY_DOC.read_text())


def docs_images(component: str) -> list[Obj]:
    """The `images:` entry of the docs' kustomization that adds manifests/<component> ([] when it has none)."""
    found = [doc for doc in map(yaml.safe_load, docs_overlays())
             if f"../manifests/{component}" in (doc.get("components") or [])]
    assert found, f"docs/deploy.md shows no kustomization adding the component manifests/{component}"
    return list(found[0].get("images") or [])


def render_with_component(overlay: str, component: str, directory: Path, *more: str) -> list[Obj]:
    """manifests/<overlay> with the kustomize components manifests/<component> (and `more`) around it, as a user
    renders them after docs/deploy.md: a kustomization of the overlay, the components, and the `images:` entry the
    docs' kustomization for each component has (kustomize gives a component's workload the overlay's image only
    through that entry). `directory` is unused and kept for the callers' fixtures."""
    del directory
    kubectl()  # skips the test, with the reason, where kubectl is missing
    images = [image for part in (component, *more) for image in docs_images(part)]
    try:
        return kustomize.render(overlay, (component, *more), {"images": images} if images else None)
    except kustomize.RenderError as exc:
        raise AssertionError(str(exc)) from None


def render(overlay: str) -> list[Obj]:
    """Every object of manifests/<overlay>, as `kubectl apply -k` would send it (a fresh copy each call)."""
    return yaml.safe_load(yaml.safe_dump(list(_rendered(overlay))))  # type: ignore[no-any-return]


def webhook_configurations(overlay: str) -> list[Obj]:
    """The MutatingWebhookConfiguration and ValidatingWebhookConfiguration of an overlay, for a test cluster."""
    return [o for o in render(overlay) if o["kind"].endswith("WebhookConfiguration")]


def objects(objs: list[Obj], kind: str) -> Iterator[Obj]:
    return (o for o in objs if o["kind"] == kind)


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objects(objs, kind) if o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected exactly one {kind} {name}, found {len(matches)}"
    return matches[0]


def pod_spec(objs: list[Obj], kind: str, name: str) -> Obj:
    template: Obj = find(objs, kind, name)["spec"]["template"]
    spec: Obj = template["spec"]
    return spec


def container(spec: Obj, name: str) -> Obj:
    matches: list[Obj] = [c for c in spec["containers"] if c["name"] == name]
    assert len(matches) == 1, f"expected one container {name}"
    return matches[0]


def env_of(ctr: Obj, objs: list[Obj]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom ConfigMaps first, then env (which wins).

    A downward-API value is shown as `<fieldRef:PATH>`.
    """
    env: dict[str, str] = {}
    for source in ctr.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        env.update(find(objs, "ConfigMap", ref)["data"])
    for item in ctr.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = f"<fieldRef:{item['valueFrom']['fieldRef']['fieldPath']}>"
    return env


def hardened(ctx: Obj) -> None:
    """A container's securityContext: no escalation, no capability, a read-only root, the runtime's seccomp."""
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx.get("privileged", False) is False
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}

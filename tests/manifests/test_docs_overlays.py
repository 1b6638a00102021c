"""The kustomizations docs/deploy.md tells users to write beside the repository render as written: every workload,
a component's too, runs one image with the overlay's pinned tag (an overlay's `images:` reach only its own objects,
so a kustomization that adds a component around it must repeat the entry)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from charts import kustomize
from tests.harness.manifests.render import MANIFESTS, docs_overlays, kubectl

WORKLOADS = ("Deployment", "DaemonSet", "Job")
TAG = kustomize.overlay_images("cert-manager")["images"][0]["newTag"]


def test_the_docs_show_every_components_kustomization() -> None:
    shown = {c.removeprefix("../manifests/") for text in docs_overlays()
             for c in yaml.safe_load(text).get("components") or []}
    assert shown == set(kustomize.components())


@pytest.mark.parametrize("text", docs_overlays(), ids=lambda text: ",".join(
    yaml.safe_load(text).get("components") or ["images"]))
def test_a_docs_kustomization_runs_one_pinned_image(text: str, tmp_path: Path) -> None:
    here = tmp_path / "my-gpushare"
    here.mkdir()
    # The docs' paths start from a folder beside the repository's manifests/.
    (here / "kustomization.yaml").write_text(text.replace("../manifests/", os.path.relpath(MANIFESTS, here) + "/"))
    done = subprocess.run([kubectl(), "kustomize", str(here)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    images = {(o["metadata"]["name"], c["image"]) for o in yaml.safe_load_all(done.stdout)
              if o and o["kind"] in WORKLOADS for c in o["spec"]["template"]["spec"]["containers"]}
    assert len({image for _, image in images}) == 1, sorted(images)
    assert all(image.rsplit(":", 1)[-1] == TAG and "/" not in image.rsplit(":", 1)[-1]
               for _, image in images), sorted(images)

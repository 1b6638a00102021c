"""The commands README.md and docs/troubleshooting.md show for a cluster, run as written on the tier's node: the
install, its verification, the first look at a pod, the upgrade and the uninstall, in the documents' order
(tests.harness.doccommands.cluster_blocks), each through bash as a reader pastes it.

What differs from a reader's run, because the tier is not the reader's cluster:

- the placeholders: the image `registry.example.com/gpushare` and its tags are the tier's image, `NODE` the tier's
  node, `NAMESPACE` and `POD` a running GPU-share pod of the test's namespace;
- `helm install` gets `-f` with the fake NVML library for the device plugin's pod, the one swap of every install
  test (e2e.install.fake_nvml_values);
- `helm` and `kubectl` are the tier's builds and `kubectl gpushare` the virtual environment's, on PATH, with the
  tier's admin kubeconfig in KUBECONFIG; cert-manager (the chart's default certificates) is the tier's.

The troubleshooting blocks run between the README's verification and its upgrade, against the installed release.
After the install block the test waits until the webhook answers through its Service (e2e.install.wait_serving):
`rollout status` returns once the pods are Ready, a moment before kube-proxy routes to them, and a reader who
verifies in that moment sees `failed calling webhook` (docs/troubleshooting.md) and runs the check again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e import install
from e2e.cluster import REPO, Cluster
from e2e.kube import Kubectl, kubectl_path
from tests.harness import doccommands
from tests.harness.realtier import workloads as w
from tests.install.test_install import assert_nothing_of_ours_left

pytestmark = pytest.mark.usefixtures("needs_extender")
DOC_NAMESPACE = "gpushare-system"  # the README's release namespace


def _substituted(command: str, values: dict[str, str]) -> str:
    command = command.replace(doccommands.IMAGE, values["repository"])
    command = re.sub(r"image\.tag=[0-9][0-9.]*", f"image.tag={values['tag']}", command)
    for placeholder in doccommands.PLACEHOLDERS:
        command = re.sub(rf"\b{placeholder}\b", values[placeholder], command)
    if re.match(r"helm install\b", command):
        command += f" -f {values['nvml']}"
    return command


def _environment(cluster: Cluster, bin_dir: Path) -> dict[str, str]:
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "helm"
    if not link.exists():
        link.symlink_to(install.helm_binary())
    path = os.pathsep.join([str(bin_dir), str(Path(kubectl_path()).parent), str(Path(sys.executable).parent),
                            os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "KUBECONFIG": str(cluster.admin_kubeconfig),
            "HELM_CACHE_HOME": str(cluster.run / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(cluster.run / "helm" / "config"),
            "HELM_DATA_HOME": str(cluster.run / "helm" / "data")}


def _run(block: doccommands.Block, command: str, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
                          check=False)
    # A command that ends in `| grep` exits 1 when nothing matched, which is the answer a reader hopes for
    # (no denial, no refusal); any other failure, or grep's own error (2), fails.
    found_nothing = (done.returncode == 1 and re.search(r"\|\s*grep\b[^|]*$", command) and not done.stdout
                     and "error" not in done.stderr.lower())
    assert done.returncode == 0 or found_nothing, (
        f"{block}: `{command}` exited {done.returncode}: {done.stderr or done.stdout}")
    return done.stdout


@pytest.fixture
def left_clean(cluster: Cluster) -> Iterator[None]:
    """Whatever happens, the release and its namespace gone afterwards, so the next install test starts clean."""
    yield
    kubectl = cluster.kubectl()
    kubectl.run(["delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "-l",
                 "app.kubernetes.io/part-of=gpushare"])
    install.helm(cluster, "uninstall", install.RELEASE, "--namespace", DOC_NAMESPACE, "--ignore-not-found")
    kubectl.run(["delete", "namespace", DOC_NAMESPACE, "--ignore-not-found"], timeout=300)
    kubectl.run(["label", "node", cluster.settings.node_name, f"{install.GPU_NODE_LABEL_KEY}-"])


@pytest.mark.usefixtures("left_clean")
def test_the_documented_cluster_commands_run_as_written(cluster: Cluster, kubectl: Kubectl, namespace: str) -> None:
    blocks = doccommands.cluster_blocks()
    readme = [b for b in blocks if b.doc == "README.md"]
    upgrade = next(i for i, b in enumerate(readme) if any(c.startswith("helm upgrade") for c in b.commands))
    first_look = [b for b in blocks if b.doc != "README.md"]
    assert readme[:upgrade] and first_look and readme[upgrade:], [str(b) for b in blocks]

    install.ensure_cert_manager(cluster)
    nvml = cluster.run / "install" / "docs-nvml.yaml"
    nvml.parent.mkdir(parents=True, exist_ok=True)
    nvml.write_text(yaml.safe_dump({"devicePlugin": install.fake_nvml_values(cluster)}))
    image = install.image_values(cluster)
    values = {"repository": image["repository"], "tag": image["tag"], "nvml": str(nvml),
              "NODE": cluster.settings.node_name, "NAMESPACE": namespace, "POD": "docs"}
    env = _environment(cluster, cluster.run / "install" / "docs-bin")

    def run_all(selected: list[doccommands.Block]) -> None:
        for block in selected:
            for command in block.commands:
                out = _run(block, _substituted(command, values), env)
                if "gpushare\\.io/intent" in command:
                    assert '"allocationId"' in out, f"{block}: the verification shows no stamped intent: {out!r}"

    for block in readme[:upgrade]:
        run_all([block])
        if any(c.startswith("helm install") for c in block.commands):
            install.wait_serving(cluster)
    install.wait_node_serving(cluster)
    assert w.create(kubectl, namespace, w.pod("docs", [w.container("main", w.image(cluster), 1)]))[0] == 0
    w.wait_running(kubectl, namespace, 1, 180)
    run_all(first_look)
    run_all(readme[upgrade:])
    assert_nothing_of_ours_left(kubectl)

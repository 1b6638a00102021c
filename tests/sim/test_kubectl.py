"""The real kubectl binary against the test API server and the real webhook."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.apiserver.auth import service_account, user
from tests.harness.apiserver.configs import project_webhook_objects
from tests.harness.apiserver.server import ApiServer
from tests.harness.webhook.server import webhook_server

KUBECTL = shutil.which("kubectl")
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed; `./dev test` installs it where it can"),
]

GPU_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: train
  labels: {app: train}
spec:
  containers:
  - name: main
    image: cuda:12
    resources:
      limits:
        aliyun.com/gpu-mem: 8
"""


@dataclass
class Kubectl:
    kubeconfig: Path
    home: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.home), "KUBECONFIG": str(self.kubeconfig)}
        done = subprocess.run([KUBECTL, f"--cache-dir={self.home / 'cache'}", "--request-timeout=20s", *args],
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed with {done.returncode}: {done.stderr}")
        return done


@dataclass
class Cluster:
    api: ApiServer
    alice: Kubectl
    extender: Kubectl
    manifest: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("kubectl")
    with webhook_server(root / "webhook") as hook, ApiServer() as api:
        api.add_service("gpushare-system", "gpushare-webhook", 443, hook.url)
        api.load_webhook_configurations(project_webhook_objects(), hook.ca_pem)
        alice = Kubectl(api.write_kubeconfig(root / "alice.kubeconfig", api.add_user(user("alice")), "alice"), root)
        extender_token = api.add_user(service_account("kube-system", "gpushare-schd-extender"))
        extender = Kubectl(api.write_kubeconfig(root / "extender.kubeconfig", extender_token, "extender"), root)
        manifest = root / "train.yaml"
        manifest.write_text(GPU_POD)
        yield Cluster(api, alice, extender, manifest)


@pytest.fixture
def train(cluster: Cluster) -> Iterator[str]:
    cluster.alice("create", "-f", str(cluster.manifest), "--validate=false")
    yield "train"
    cluster.alice("delete", "pod", "train", "--ignore-not-found", "--wait=true", "--timeout=20s")


def test_create_shows_the_stamped_intent(cluster: Cluster, train: str) -> None:
    pod = json.loads(cluster.alice("get", "pod", train, "-o", "json").stdout)
    intent = json.loads(pod["metadata"]["annotations"]["gpushare.io/intent"])
    assert intent["total"] == 8
    assert pod["metadata"]["annotations"]["gpushare.io/intent-signature"]


def test_ordinary_user_annotate_is_refused_with_the_webhook_message(cluster: Cluster, train: str) -> None:
    done = cluster.alice("annotate", "pod", train, "--overwrite", "ALIYUN_COM_GPU_MEM_IDX=1", check=False)
    assert done.returncode != 0
    assert 'admission webhook "validate.gpushare.io" denied the request' in done.stderr
    assert "ALIYUN_COM_GPU_MEM_IDX" in done.stderr and "alice" in done.stderr
    annotations = json.loads(cluster.alice("get", "pod", train, "-o", "json").stdout)["metadata"]["annotations"]
    assert "ALIYUN_COM_GPU_MEM_IDX" not in annotations


def test_extender_identity_may_annotate(cluster: Cluster, train: str) -> None:
    cluster.extender("annotate", "pod", train, "ALIYUN_COM_GPU_MEM_IDX=1", "ALIYUN_COM_GPU_MEM_DEV=64",
                     "ALIYUN_COM_GPU_MEM_POD=8", "ALIYUN_COM_GPU_MEM_ASSIGNED=false",
                     "ALIYUN_COM_GPU_MEM_ASSUME_TIME=1700000000000000000")
    shown = cluster.alice("get", "pod", train, "-o", "jsonpath={.metadata.annotations.ALIYUN_COM_GPU_MEM_IDX}")
    assert shown.stdout == "1"


def test_label_patch_and_table(cluster: Cluster, train: str) -> None:
    cluster.alice("label", "pod", train, "team=ml")
    cluster.alice("patch", "pod", train, "-p", '{"metadata":{"labels":{"stage":"dev"}}}')
    cluster.alice("patch", "pod", train, "--type=json", "-p", '[{"op":"add","path":"/metadata/labels/j","value":"1"}]')
    labels = json.loads(cluster.alice("get", "pod", train, "-o", "jsonpath={.metadata.labels}").stdout)
    assert labels == {"app": "train", "team": "ml", "stage": "dev", "j": "1"}
    table = cluster.alice("get", "pods", "-l", "team=ml").stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert table[1].split()[:3] == ["train", "0/1", "Pending"]


def test_delete_waits_until_gone(cluster: Cluster) -> None:
    cluster.alice("run", "plain", "--image=busybox", "--restart=Never")
    cluster.alice("delete", "pod", "plain", "--timeout=20s")
    assert "No resources found" in cluster.alice("get", "pods", "--field-selector=metadata.name=plain").stderr


def test_describe_and_watch_table(cluster: Cluster, train: str) -> None:
    described = cluster.alice("describe", "pod", train).stdout
    assert "gpushare.io/intent" in described and "Status:       Pending" in described
    assert KUBECTL is not None
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(cluster.alice.home),
           "KUBECONFIG": str(cluster.alice.kubeconfig)}
    before = cluster.api.store.watch_count
    with subprocess.Popen([KUBECTL, f"--cache-dir={cluster.alice.home / 'cache'}", "get", "pods", train, "-w",
                           "--request-timeout=3s"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as watching:
        deadline = time.monotonic() + 30
        while cluster.api.store.watch_count == before and time.monotonic() < deadline:
            time.sleep(0.02)
        cluster.alice("label", "pod", train, "watched=yes")
        out, err = watching.communicate(timeout=60)
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], err
    assert [row[:3] for row in rows[1:]] == [[train, "0/1", "Pending"]] * 2


def test_client_side_apply(cluster: Cluster, tmp_path: Path) -> None:
    manifest = tmp_path / "web.yaml"
    body = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {{app: web}}\nspec:\n" \
           "  containers:\n  - name: c\n    image: {image}\n"
    manifest.write_text(body.format(image="nginx:1"))
    assert "pod/web created" in cluster.alice("apply", "-f", str(manifest), "--validate=false").stdout
    manifest.write_text(body.format(image="nginx:2"))
    assert "pod/web configured" in cluster.alice("apply", "-f", str(manifest), "--validate=false").stdout
    shown = cluster.alice("get", "pod", "web", "-o", "jsonpath={.spec.containers[0].image}").stdout
    assert shown == "nginx:2"
    cluster.alice("delete", "-f", str(manifest), "--timeout=20s")

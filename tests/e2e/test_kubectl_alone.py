"""`kubectl gpushare` installed on its own (the kubectl-gpushare wheel alone in a fresh virtual environment), found by
the real kubectl, on the real API server: --as a ServiceAccount that may not list nodes gets one line that says so,
--as one that may sees the pods -l selects as -o json, -o yaml and -o wide; --as by a user who may not impersonate,
and a selector the API server rejects, each get one line."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import Cluster
from e2e.kube import Kubectl, kubectl_path
from tests.harness.kubectl_alone import install_alone, wheel_from_copy
from tests.harness.realtier import workloads as w


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a fresh virtual environment holding the kubectl-gpushare wheel and nothing else of ours."""
    wheel = wheel_from_copy(tmp_path_factory.mktemp("clone"), tmp_path_factory.mktemp("wheel"))
    return install_alone(wheel, tmp_path_factory.mktemp("alone")).parent


def gpushare(alone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl gpushare ARGS`, kubectl finding the plugin installed alone first on PATH."""
    env = {**os.environ, "PATH": f"{alone}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([kubectl_path(), "gpushare", *args], capture_output=True, text=True, timeout=60, env=env,
                          check=False)


@pytest.fixture
def viewer(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A ServiceAccount that may list what the plugin reads, cluster-wide; another, `nobody`, that may not."""
    name = f"gpushare-viewer-{namespace}"
    for account in ("viewer", "nobody"):
        kubectl.ok(["create", "serviceaccount", account, "-n", namespace])
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["nodes", "pods", "events"], "verbs": ["list"]},
                      {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list"]}]}
    kubectl.ok(["apply", "-f", "-"], stdin=json.dumps(role))  # no discovery check: resource.k8s.io may be unserved
    kubectl.ok(["create", "clusterrolebinding", name, f"--clusterrole={name}",
                f"--serviceaccount={namespace}:viewer"])
    try:
        yield f"system:serviceaccount:{namespace}:viewer"
    finally:
        kubectl.run(["delete", "clusterrolebinding", name])
        kubectl.run(["delete", "clusterrole", name])


def names(doc: dict[str, Any]) -> set[str]:
    """Every pod the document shows, wherever it stands: on a GPU, on a node without one, or pending."""
    shown = {p["name"] for n in doc["nodes"] for g in n["gpus"] for p in g["pods"]}
    return shown | {p["name"] for n in doc["nodes"] for p in n["unplaced"]} | {p["name"] for p in doc["pending"]}


def test_as_selector_and_every_output(alone: Path, cluster: Cluster, kubectl: Kubectl, namespace: str,
                                      viewer: str) -> None:
    img = w.image(cluster)
    pods = [w.pod(name, [w.container("main", img, 2)]) for name in ("alpha", "beta")]
    for one in pods:
        one["metadata"]["labels"] = {"app": one["metadata"]["name"]}
    assert w.create(kubectl, namespace, *pods)[0] == 0
    admin = str(cluster.admin_kubeconfig)

    nobody = gpushare(alone, "--kubeconfig", admin, "--as", f"system:serviceaccount:{namespace}:nobody",
                      "-n", namespace)
    assert (nobody.returncode, nobody.stdout) == (1, "")
    assert nobody.stderr.count("\n") == 1, nobody.stderr
    assert nobody.stderr.startswith('error: You may not list nodes (403 Forbidden: nodes is forbidden: User '
                                    f'"system:serviceaccount:{namespace}:nobody" cannot list resource "nodes" in API '
                                    'group "" at the cluster scope); ask for a role'), nobody.stderr

    as_viewer = ("--kubeconfig", admin, "--as", viewer, "-n", namespace, "-l", "app=alpha")
    shown = gpushare(alone, *as_viewer, "-o", "json")
    assert (shown.returncode, shown.stderr) == (0, "")
    doc = json.loads(shown.stdout)
    assert (doc["apiVersion"], doc["kind"], doc["namespace"], doc["selector"]) == (
        "gpushare.io/v1", "GpushareStatus", namespace, "app=alpha")
    assert names(doc) == {"alpha"}
    as_yaml = gpushare(alone, *as_viewer, "-o", "yaml")
    assert (as_yaml.returncode, as_yaml.stderr) == (0, "")
    assert names(yaml.safe_load(as_yaml.stdout)) == {"alpha"}
    wide = gpushare(alone, *as_viewer, "-o", "wide")
    assert (wide.returncode, wide.stderr) == (0, "")
    assert "beta" not in wide.stdout
    assert wide.stdout.rstrip().endswith(f"Only pods of namespace {namespace} are counted; run without -n to count "
                                         "every namespace. Only pods matching app=alpha are counted; run without -l "
                                         "to count every pod.")
    assert wide.stdout.splitlines()[0].split()[-2:] == ["PODS", "NAMESPACE/POD"], wide.stdout


def test_as_without_the_right_and_a_bad_selector_give_one_line(alone: Path, cluster: Cluster,
                                                                namespace: str) -> None:
    tenant = gpushare(alone, "--kubeconfig", str(cluster.tenant_kubeconfig), "--as", "someone-else", "-n", namespace)
    assert (tenant.returncode, tenant.stdout) == (1, "")
    # The tier's API server words it per verb and resource (constrained impersonation): 'nodes is forbidden: User
    # "tenant-user" cannot impersonate-on:user-info:list resource "nodes" ...'; older ones name the users resource.
    assert tenant.stderr.startswith("error: You may not act as someone-else (403 Forbidden: "), tenant.stderr
    assert 'User "tenant-user" cannot impersonate' in tenant.stderr, tenant.stderr
    assert tenant.stderr.rstrip().endswith("ask for a role that may impersonate that user and those groups, or run "
                                           "without --as."), tenant.stderr
    bad = gpushare(alone, "--kubeconfig", str(cluster.admin_kubeconfig), "-l", "app in (alpha", "-n", namespace)
    assert (bad.returncode, bad.stdout) == (1, "")
    assert bad.stderr.startswith(f"error: The API server at {cluster.server} rejected the label selector of the "
                                 f"request to list pods matching 'app in (alpha' in namespace {namespace} (400 Bad "
                                 "Request: "), bad.stderr
    assert bad.stderr.rstrip().endswith("; fix -l/--selector, such as app=train or 'tier in (a,b)'."), bad.stderr
    for failed in (tenant, bad):
        assert failed.stderr.count("\n") == 1, failed.stderr

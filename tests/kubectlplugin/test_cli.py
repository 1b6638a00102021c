"""The installed `kubectl-gpushare` executable (and `kubectl gpushare`, where kubectl is installed) against the test
API server holding the golden cluster: the same tables as the golden file, the same JSON and YAML, kubectl's
`-l`, `--as` and `-o wide`, one line on failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubectlplugin import render
from tests.harness.apiserver.auth import User, user
from tests.harness.apiserver.resources import Resource
from tests.harness.apiserver.server import ApiServer
from tests.kubectlplugin.conftest import deny_bob
from tests.kubectlplugin.test_render import GOLDEN, golden_report

EXECUTABLE = Path(sys.executable).parent / "kubectl-gpushare"
KUBECTL = shutil.which("kubectl")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not EXECUTABLE.exists(), reason="kubectl-gpushare is not installed; run `pip install -e .`"),
]


def run(*args: str, home: Path, env: dict[str, str] | None = None, kubectl: bool = False
        ) -> subprocess.CompletedProcess[str]:
    base = {"PATH": f"{EXECUTABLE.parent}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(home)}
    argv = [KUBECTL or "kubectl", "gpushare", *args] if kubectl else [str(EXECUTABLE), *args]
    return subprocess.run(argv, env={**base, **(env or {})}, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def admin(api: ApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "admin.kubeconfig")


def test_the_table_is_the_golden_one(admin: Path, tmp_path: Path) -> None:
    done = run("-d", "--kubeconfig", str(admin), home=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == GOLDEN.read_text()


def test_json_and_kubeconfig_from_the_environment(admin: Path, tmp_path: Path) -> None:
    done = run("-o", "json", home=tmp_path, env={"KUBECONFIG": f"{tmp_path / 'absent'}:{admin}"})
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == render.document(golden_report())


def test_namespace_and_node_arguments(admin: Path, tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    shutil.copy(admin, tmp_path / ".kube" / "config")
    doc = json.loads(run("-n", "legacy", "-o", "json", "gpu-a", home=tmp_path).stdout)
    assert doc["namespace"] == "legacy"
    assert [(n["name"], [(g["index"], g["promised"]) for g in n["gpus"]]) for n in doc["nodes"]] == [
        ("gpu-a", [(0, 0), (1, 6)])]
    assert doc["pending"] == []


@pytest.mark.parametrize(("args", "expected"), [
    (["--kubeconfig", "/nonexistent/kubeconfig"],
     "error: The kubeconfig /nonexistent/kubeconfig given by --kubeconfig does not exist; pass the path of an "
     "existing kubeconfig file.\n"),
    (["--context", "nowhere"], "error: The kubeconfig {admin} has no context 'nowhere' (it has sim); pass one of them "
     "with --context.\n"),
])
def test_a_bad_kubeconfig_gives_one_line_and_exit_1(args: list[str], expected: str, admin: Path,
                                                     tmp_path: Path) -> None:
    done = run(*args, home=tmp_path, env={"KUBECONFIG": str(admin)})
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == expected.format(admin=admin)


def test_forbidden_access_gives_one_line_and_exit_1(api: ApiServer, tmp_path: Path) -> None:
    bob = api.write_kubeconfig(tmp_path / "bob", api.add_user(user("bob")))
    done = run("--kubeconfig", str(bob), "-n", "ml", home=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith('error: You may not list nodes (403 Forbidden: nodes is forbidden: User "bob" '
                                  'cannot list resource "nodes" in API group "" at the cluster scope); ask for a role')


def test_yaml_is_the_json_document(admin: Path, tmp_path: Path) -> None:
    done = run("-o", "yaml", "--kubeconfig", str(admin), home=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("apiVersion: gpushare.io/v1\nkind: GpushareStatus\n")
    assert yaml.safe_load(done.stdout) == render.document(golden_report())


def test_wide_names_the_pods_of_each_gpu(admin: Path, tmp_path: Path) -> None:
    done = run("-o", "wide", "--kubeconfig", str(admin), home=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    rows = [line.split() for line in done.stdout.splitlines()[:5]]
    assert rows[0][-2:] == ["PODS", "NAMESPACE/POD"]
    assert [(r[0], r[1], r[-1]) for r in rows[1:]] == [
        ("gpu-a", "0", "ml/serve,ml/train"), ("gpu-a", "1", "legacy/notebook,ml/moved"), ("gpu-b", "0", "ml/eval"),
        ("gpu-b", "-", "ml/direct")]


@pytest.mark.parametrize(("selector", "namespace", "names"), [
    ("app in (train,notebook,huge)", None, {"train", "notebook", "huge"}),
    ("team=ml,app!=huge", "ml", {"train", "serve", "moved", "eval", "direct"}),
])
def test_selector_counts_only_the_matching_pods(selector: str, namespace: str | None, names: set[str],
                                                admin: Path, tmp_path: Path) -> None:
    scope = ["-n", namespace] if namespace else []
    done = run("-l", selector, *scope, "-o", "json", "--kubeconfig", str(admin), home=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    doc = json.loads(done.stdout)
    shown = {p["name"] for n in doc["nodes"] for g in n["gpus"] for p in g["pods"]}
    shown |= {p["name"] for n in doc["nodes"] for p in n["unplaced"]} | {p["name"] for p in doc["pending"]}
    assert (shown, doc["selector"], doc["namespace"]) == (names, selector, namespace)
    table = run("-l", selector, *scope, "--kubeconfig", str(admin), home=tmp_path).stdout
    assert f"Only pods matching {selector} are counted; run without -l to count every pod." in table


def test_as_acts_as_the_user_and_its_groups(api: ApiServer, admin: Path, tmp_path: Path) -> None:
    seen: list[tuple[str, tuple[str, ...]]] = []

    def record(who: User, verb: str, res: Resource, sub: str, namespace: str, name: str) -> str | None:
        seen.append((who.username, who.groups))
        return deny_bob(who, verb, res, sub, namespace, name)

    api._authorize = record
    try:
        done = run("--as", "jane", "--as-group", "gpu-users", "--as-group", "ml-team", "-n", "ml",
                   "--kubeconfig", str(admin), home=tmp_path)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert ("jane", ("gpu-users", "ml-team", "system:authenticated")) in seen
        assert {who for who, _ in seen} == {"kubernetes-admin", "jane"}  # the admin only asks to impersonate
    finally:
        api._authorize = deny_bob


@pytest.mark.parametrize(("who", "args", "expected"), [
    ("admin", ["--as", "bob", "-n", "ml"], 'error: You may not list nodes (403 Forbidden: nodes is forbidden: User '
     '"bob" cannot list resource "nodes" in API group "" at the cluster scope); ask for a role'),
    ("bob", ["--as", "alice"], 'error: You may not act as alice (403 Forbidden: users is forbidden: User "bob" cannot '
     'impersonate resource "users" in API group "" at the cluster scope); ask for a role that may impersonate that '
     "user and those groups, or run without --as.\n"),
    ("admin", ["-l", "app in (train"], "error: The API server at {server} rejected the label selector of the request "
     "to list pods matching 'app in (train' in all namespaces (400 Bad Request: unable to parse requirement: "),
])
def test_forbidden_as_and_a_bad_selector_give_one_line(who: str, args: list[str], expected: str, api: ApiServer,
                                                      admin: Path, tmp_path: Path) -> None:
    config = admin if who == "admin" else api.write_kubeconfig(tmp_path / who, api.add_user(user(who)))
    done = run(*args, "--kubeconfig", str(config), home=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(expected.format(server=api.url)), done.stderr


def test_bad_arguments_exit_2_and_help_lists_the_settings(tmp_path: Path) -> None:
    done = run("-o", "xml", home=tmp_path)
    assert done.returncode == 2 and "invalid choice: 'xml'" in done.stderr
    assert run("-n", "a", "-A", home=tmp_path).returncode == 2
    lonely = run("--as-group", "admins", home=tmp_path)
    assert lonely.returncode == 2 and "--as-group needs --as: name the user to act as" in lonely.stderr
    assert run("--request-timeout", "-1", home=tmp_path).returncode == 2
    bad_unit = run(home=tmp_path, env={"GPUSHARE_UNIT": "TiB"})
    assert bad_unit.returncode == 2 and "GPUSHARE_UNIT" in bad_unit.stderr
    shown = run("--help", home=tmp_path).stdout
    for setting in ("GPUSHARE_RESOURCE_NAME", "GPUSHARE_UNIT", "GPUSHARE_ANNOTATION_PREFIX", "KUBECONFIG",
                    "--kubeconfig", "--context", "--namespace", "--all-namespaces", "--selector", "--as USER",
                    "--as-group GROUP", "{table,wide,json,yaml}", "Exit status"):
        assert setting in shown
    assert run("--version", home=tmp_path).stdout.startswith("kubectl-gpushare ")
    assert shown.startswith("usage: kubectl gpushare [NODE ...]")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed; `./dev test` installs it where it can")
def test_kubectl_finds_the_plugin(admin: Path, tmp_path: Path) -> None:
    done = run("-d", "--kubeconfig", str(admin), home=tmp_path, kubectl=True)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == GOLDEN.read_text()
    listed = subprocess.run([str(KUBECTL), "plugin", "list"], capture_output=True, text=True, timeout=60,
                            env={"PATH": f"{EXECUTABLE.parent}{os.pathsep}{os.environ.get('PATH', '')}",
                                 "HOME": str(tmp_path)}, check=False)
    assert str(EXECUTABLE) in listed.stdout

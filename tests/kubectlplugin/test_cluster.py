"""The plugin's API adapter against the test API server: kubeconfig choice as kubectl makes it, the three lists, and
one line for every way of failing (no file, a broken file, an unknown context, no server, wrong CA, no answer,
bad credentials, no rights)."""

from __future__ import annotations

import base64
import itertools
import json
import socket
from pathlib import Path

import pytest

from kubectlplugin.cluster import Access, ClusterError, contexts, kubeconfig_files, read
from tests.harness.apiserver.auth import User, user
from tests.harness.apiserver.resources import Resource
from tests.harness.apiserver.server import ApiServer
from tests.harness.tls import Authority
from tests.kubectlplugin.conftest import deny_bob

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def admin_config(api: ApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "admin.kubeconfig")


def access(path: Path | str, **more: object) -> Access:
    return Access(kubeconfig=str(path), timeout=5.0, **more)  # type: ignore[arg-type]


def test_reads_nodes_pods_and_events(api: ApiServer, admin_config: Path) -> None:
    snapshot = read(access(admin_config), None)
    assert snapshot.server == api.url
    assert {n["metadata"]["name"] for n in snapshot.nodes} == {"gpu-a", "gpu-b", "cpu-only"}
    assert {p["metadata"]["name"] for p in snapshot.pods} >= {"train", "nginx", "huge"}
    assert {e["reason"] for e in snapshot.events} == {"GpuShareAllocated", "GpuShareNoRoom", "Scheduled"}
    scoped = read(access(admin_config), "legacy")
    assert {p["metadata"]["name"] for p in scoped.pods} == {"notebook", "fresh"}
    assert scoped.events == []


def test_kubeconfig_choice_follows_kubectl(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "from-a"}))
    second.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "from-b"}))
    listed = f"{tmp_path / 'missing'}:{first}:{second}"
    assert kubeconfig_files(Access(env_kubeconfig=listed)) == [str(first), str(second)]
    assert contexts([str(first), str(second)]) == ("from-a", [])  # the first file that sets one wins
    assert kubeconfig_files(Access(kubeconfig=str(second), env_kubeconfig=listed)) == [str(second)]
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    assert kubeconfig_files(Access(home=str(home))) == []
    (home / ".kube" / "config").write_text("{}")
    assert kubeconfig_files(Access(home=str(home))) == [str(home / ".kube" / "config")]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_edits = itertools.count()


def _edited(path: Path, **changes: str) -> Path:
    doc = json.loads(path.read_text())
    cluster = doc["clusters"][0]["cluster"]
    for key, value in changes.items():
        if key == "token":
            doc["users"][0]["user"]["token"] = value
        else:
            cluster[key] = value
    out = path.with_name(f"{path.name}.{next(_edits)}")
    out.write_text(json.dumps(doc))
    return out


def test_each_failure_is_one_line_that_says_what_to_do(api: ApiServer, admin_config: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("clusters: [unclosed\n")
    listless = tmp_path / "listless"
    listless.write_text("- a\n- b\n")
    no_current = tmp_path / "no-current"
    no_current.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": []}))
    wrong_ca = Authority("someone-else").cert_pem
    bob = api.write_kubeconfig(tmp_path / "bob", api.add_user(user("bob")))
    exec_login = tmp_path / "exec"
    doc = json.loads(admin_config.read_text())
    doc["users"][0]["user"] = {"exec": {"command": "/nonexistent/login",
                                        "apiVersion": "client.authentication.k8s.io/v1"}}
    exec_login.write_text(json.dumps(doc))
    with socket.socket() as silent:  # accepts connections into its backlog and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        cases = [
            (access(tmp_path / "nothing-here"), None, "given by --kubeconfig does not exist"),
            (Access(env_kubeconfig=str(tmp_path / "x")), None, "none of the kubeconfig files in KUBECONFIG"),
            (Access(home=str(tmp_path)), None, "no kubeconfig was found"),
            (access(broken), None, "could not be read"),
            (access(listless), None, "is not a kubeconfig (a YAML mapping)"),
            (access(no_current), None, "sets no current-context; pass --context NAME"),
            (access(admin_config, context="prod"), None, "has no context 'prod' (it has sim); pass one of them"),
            (access(_edited(admin_config, server="")), None, "the cluster of context 'sim' in the kubeconfig"),
            (access(_edited(admin_config, **{"certificate-authority-data": "@@"})), None,
             "could not be verified over TLS ("),
            (access(exec_login), None, f"the user of context 'sim' in the kubeconfig {exec_login} got no credentials "
             "([Errno 2] No such file or directory: '/nonexistent/login'); fix its exec command or log in again"),
            (access(_edited(admin_config, server=f"https://127.0.0.1:{_closed_port()}")), None,
             "could not be reached (Failed to establish a new connection: [Errno 111] Connection refused)"),
            (access(_edited(admin_config, **{"certificate-authority-data": base64.b64encode(wrong_ca).decode()})),
             None, "could not be verified over TLS ([SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
             "unable to get local issuer certificate); check"),
            (Access(kubeconfig=str(_edited(admin_config, server=f"https://127.0.0.1:{silent.getsockname()[1]}")),
                    timeout=0.5), None, "did not answer within 0.5 s"),
            (access(_edited(admin_config, token="not-a-token")), None, "did not accept your credentials (401"),
            (access(bob), None, 'you may not list nodes (403 Forbidden: nodes is forbidden: User "bob" cannot list'),
        ]
        for given, namespace, expected in cases:
            with pytest.raises(ClusterError) as failed:
                read(given, namespace)
            text = str(failed.value)
            assert expected in text, text
            assert "\n" not in text and "Traceback" not in text


def test_forbidden_in_all_namespaces_suggests_one(api: ApiServer, tmp_path: Path) -> None:
    def nodes_ok(who: User, verb: str, res: Resource, sub: str, namespace: str, name: str) -> str | None:
        return None if res.plural == "nodes" else deny_bob(who, verb, res, sub, namespace, name)

    api._authorize = nodes_ok  # this test's rights: nodes, and pods of `ml` only
    try:
        bob = api.write_kubeconfig(tmp_path / "bob", api.add_user(user("bob")))
        with pytest.raises(ClusterError) as failed:
            read(access(bob), None)
        assert "you may not list pods in all namespaces (403" in str(failed.value)
        assert str(failed.value).endswith("or run with -n NAMESPACE for one namespace you may read")
        assert {p["metadata"]["name"] for p in read(access(bob), "ml").pods} >= {"train", "eval"}
    finally:
        api._authorize = deny_bob

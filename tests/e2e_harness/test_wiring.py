"""The tier's wiring that decides without a cluster: settings, manifests for the host-run workloads, node
configurations, version stamping, and processes stopped by PID."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.settings import SettingsError
from e2e import gpushare, node, procs, toolchain
from e2e.settings import E2eSettings, from_environ, requested


@pytest.mark.parametrize(("value", "message"), [("x", "is not a port number"), ("80", "between 1024 and 65000")])
def test_a_bad_port_base_names_the_variable(value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=f"GPUSHARE_E2E_PORT_BASE.*{message}"):
        from_environ({"GPUSHARE_E2E_PORT_BASE": value})


def test_settings_defaults_and_the_request_flag() -> None:
    s = from_environ({"HOME": "/home/x"})
    assert s.cache_dir == Path("/home/x/.cache/gpushare-e2e") and s.port(3) == 24003
    assert requested({"GPUSHARE_E2E": "1"}) and not requested({})


DOCS: list[dict[str, Any]] = [
    {"kind": "ConfigMap", "metadata": {"name": "gpushare-config"}, "data": {"GPUSHARE_DELIVERY": "env", "A": "1"}},
    {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [{
        "envFrom": [{"configMapRef": {"name": "gpushare-config"}}],
        "env": [{"name": "A", "value": "2"}, {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
    }]}}}},
    {"kind": "MutatingWebhookConfiguration", "webhooks": [{"clientConfig": {"service": {"path": "/mutate"}}}]},
    {"kind": "PodDisruptionBudget"},
]


def test_the_cluster_gets_url_client_configs_and_no_host_run_workloads() -> None:
    applied = gpushare.for_cluster([dict(d) for d in DOCS], 24006)
    assert [d["kind"] for d in applied] == ["ConfigMap", "MutatingWebhookConfiguration"]
    assert applied[1]["webhooks"][0]["clientConfig"] == {"url": "https://127.0.0.1:24006/mutate"}


def test_workload_env_is_the_configmap_then_plain_values_then_overrides() -> None:
    env = gpushare.workload_env(DOCS, "Deployment", {"GPUSHARE_DELIVERY": "cdi"})
    assert env == {"GPUSHARE_DELIVERY": "cdi", "A": "2"}


def test_node_configurations(tmp_path: Path) -> None:
    settings = E2eSettings(cache_dir=tmp_path, run_dir=tmp_path, port_base=30000)
    tools = toolchain.Toolchain(release=settings.release, kubernetes=tmp_path, containerd=tmp_path,
                                pause=tmp_path / "pause", cert_manager=tmp_path,
                                runc=Path("/usr/sbin/runc"), cni_bin=Path("/usr/lib/cni"), busybox=Path("/bin/busybox"))
    text = node.containerd_config(settings, tools, tmp_path).read_text()
    sandbox = 'sandbox = "127.0.0.1:30004/gpushare-e2e/pause:1"'
    for line in ("enable_cdi = true", "restrict_oom_score_adj = true", sandbox):
        assert line in text
    hosts = tmp_path / "certs.d" / "127.0.0.1:30004" / "hosts.toml"
    assert 'server = "http://127.0.0.1:30004"' in hosts.read_text()
    kubelet = yaml.safe_load(node.kubelet_config(settings, tmp_path, tmp_path / "ca.crt",
                                                 (tmp_path / "a", tmp_path / "b")).read_text())
    assert (kubelet["cgroupDriver"], kubelet["failCgroupV1"], kubelet["port"]) == ("cgroupfs", False, 30007)


def test_version_stamping_names_every_version_package() -> None:
    flags = toolchain._version_ldflags("v1.34.4")
    assert "-X k8s.io/component-base/version.gitVersion=v1.34.4" in flags
    assert "-X k8s.io/client-go/pkg/version.gitMinor=34" in flags


def test_processes_are_stopped_by_pid_also_when_the_state_file_lost_them(tmp_path: Path) -> None:
    group = procs.Processes(tmp_path)
    first = group.start("one", [sys.executable, "-c", "import time; time.sleep(60)"])
    second = group.start("two", [sys.executable, "-c", "import time; time.sleep(60)"])
    # Between fork and exec a child's /proc/PID/environ is still its parent's, without the OWNER marker.
    deadline = time.monotonic() + 10
    while not set(procs.owned_pids(tmp_path)) >= {first.pid, second.pid} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(procs.owned_pids(tmp_path)) >= {first.pid, second.pid}
    (tmp_path / "pids.json").write_text("{}")  # lost track of both
    stopped = procs.stop_recorded(tmp_path)
    assert len(stopped) == 2
    for proc in (first, second):
        proc.process.wait(timeout=5)
    assert procs.owned_pids(tmp_path) == []


def test_a_process_that_exits_early_fails_with_its_log(tmp_path: Path) -> None:
    group = procs.Processes(tmp_path)
    group.start("broken", [sys.executable, "-c", "print('cannot bind'); raise SystemExit(3)"])
    with pytest.raises(procs.StartError, match=r"broken exited with status 3[\s\S]*cannot bind"):
        group.wait_ready("broken", lambda: False, 10, "listening")


def test_check_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    missing = toolchain.check()
    assert any("Go toolchain" in m for m in missing) and any("gcc" in m for m in missing)
    if os.geteuid() != 0:
        assert any("root" in m for m in missing)


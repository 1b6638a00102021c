"""A one-node cluster of upstream components with gpushare beside them: up, delivery switch, restarts, down.

    python -m e2e.cluster up      # build what is missing, start everything, print how to reach it
    python -m e2e.cluster down    # stop whatever a run left (also after Ctrl-C or a crash), unmount, clean

In tests: `Cluster(settings, toolchain).up()` ... `.down()`; `down()` is safe to call at any point.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from contract.keys import DRA_DRIVER
from e2e import control, extender, fakenvml, gpushare, netns, node, podnet, procs
from e2e import settings as ports
from e2e.certmanager import CertManager
from e2e.kube import Kubectl
from e2e.pki import Pki, kubeconfig
from e2e.settings import E2eSettings, from_environ
from e2e.toolchain import PLUGIN_BINARY, PLUGIN_IMAGE, Toolchain, ToolchainError, ensure
from node.inventory import fake_gpus

REPO = Path(__file__).resolve().parents[1]
TENANT = "tenant-user"  # an ordinary user: edit rights in the test namespaces, nothing more


class Cluster:
    def __init__(self, settings: E2eSettings, toolchain: Toolchain,
                 extra_binary_images: dict[str, Path] | None = None, extra_layouts: tuple[Path, ...] = (),
                 chart: Path | None = None) -> None:
        """`extra_binary_images`: NAME:TAG -> program, more images of one program each for the registry to serve
        (e2e.registry --binary-image), set before `up`; `extra_layouts`: more OCI layouts of the project's image for
        it to serve (a previous release's); `chart`: what `helm install` installs (e2e.install), the working tree's
        charts/gpushare unless a packaged release chart is given."""
        self.settings = settings
        self.toolchain = toolchain
        self.extra_binary_images = dict(extra_binary_images or {})
        self.extra_layouts = extra_layouts
        self.chart = chart or REPO / "charts" / "gpushare"
        self.run = settings.run_dir
        self.pki_dir = self.run / "pki"
        self.conf = self.run / "conf"
        self.procs = procs.Processes(self.run)
        self.server = f"https://127.0.0.1:{settings.port(ports.API_SERVER)}"
        self.delivery = "env"
        self.docs: list[dict[str, Any]] = []
        self.components: tuple[str, ...] = ()  # kustomize components of the admission path (gpushare.path_components)

    # -- paths and clients ----------------------------------------------------------------------------

    @property
    def admin_kubeconfig(self) -> Path:
        return self.conf / "admin.kubeconfig"

    @property
    def tenant_kubeconfig(self) -> Path:
        return self.conf / "tenant.kubeconfig"

    @property
    def dra_kubeconfig(self) -> Path:
        """The DRA driver's identity (start_dra writes it)."""
        return self.conf / "dra-plugin.kubeconfig"

    def kubectl(self, as_tenant: bool = False) -> Kubectl:
        return Kubectl(self.tenant_kubeconfig if as_tenant else self.admin_kubeconfig)

    def has(self, kind: str, name: str, namespace: str) -> bool:
        return self.kubectl().run(["get", kind, name, "-n", namespace], timeout=10)[0] == 0

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: the scheduler extender's writes (e2e.control.audit_policy)."""
        return self.procs.logs / "audit.log"

    def log(self, name: str) -> Path:
        return self.procs.logs / f"{name}.log"

    @property
    def nvml_events(self) -> Path:
        """The file the plugin's (fake) NVML library reads XID events from: see fakenvml.inject_xid."""
        return self.run / "nvml-events"

    # -- up -------------------------------------------------------------------------------------------

    def up(self, host_gpushare: bool = True) -> None:
        """Everything; with host_gpushare False, no gpushare object or process (e2e.install installs the chart),
        only the scheduler extender the scheduler is configured with."""
        down(self.settings)
        if any(p.endswith(b"/kubelet") for p in _process_names()):
            raise procs.StartError("a kubelet is already running on this machine; the tier needs the node to itself")
        shutil.rmtree(self.run, ignore_errors=True)
        self.conf.mkdir(parents=True)
        self.procs = procs.Processes(self.run)
        try:
            self._control_plane()
            self._node()
            if host_gpushare:
                self._gpushare()
            else:
                self.kubectl().ok(["apply", "-f", "-"], stdin=gpushare.EXTENDER_RBAC)
                self.start_extender()
                self._default_service_account()
        except BaseException:
            self.down()
            raise

    def _control_plane(self) -> None:
        s, tc, pki = self.settings, self.toolchain, Pki(self.pki_dir)
        pki.issue("apiserver", "kube-apiserver", hosts=("127.0.0.1", "localhost", "kubernetes",
                                                        "kubernetes.default", "kubernetes.default.svc", "198.51.100.1"))
        admin = pki.issue("admin", "gpushare-e2e-admin", org="system:masters")
        pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", org="system:masters")
        pki.service_account_keys()
        kubeconfig(self.admin_kubeconfig, self.server, pki.ca, client=admin)
        kubeconfig(self.tenant_kubeconfig, self.server, pki.ca, client=pki.issue("tenant", TENANT), user=TENANT)
        kcm = kubeconfig(self.conf / "kcm.kubeconfig", self.server, pki.ca,
                         client=pki.issue("kcm", "system:kube-controller-manager"))
        sched = kubeconfig(self.conf / "scheduler.kubeconfig", self.server, pki.ca,
                           client=pki.issue("scheduler", "system:kube-scheduler"))
        # The user the bootstrap ClusterRoleBinding system:node-proxier binds.
        kubeconfig(self.conf / "kube-proxy.kubeconfig", self.server, pki.ca,
                   client=pki.issue("kube-proxy", "system:kube-proxy"))
        kubeconfig(self.conf / "kubelet.kubeconfig", self.server, pki.ca,
                   client=pki.issue("kubelet", f"system:node:{s.node_name}", org="system:nodes"))
        pki.issue("kubelet-serving", s.node_name, hosts=("127.0.0.1", s.node_name))
        self.cert_manager_serving = pki.issue("cert-manager-webhook", "cert-manager-webhook", hosts=("127.0.0.1",))

        self.procs.start("etcd", control.etcd(s, tc.kube("etcd"), self.run / "etcd"))
        etcd_health = f"http://127.0.0.1:{s.port(ports.ETCD)}/health"
        self.procs.wait_ready("etcd", lambda: _http_ok(etcd_health), 60, "answering /health")
        audit = (control.audit_policy(self.conf / "audit-policy.yaml"), self.audit_log)
        self.procs.start("kube-apiserver", control.apiserver(s, tc.kube("kube-apiserver"), self.pki_dir, audit))
        kubectl = self.kubectl()
        self.procs.wait_ready("kube-apiserver", lambda: kubectl.run(["get", "--raw", "/readyz"], timeout=5)[0] == 0,
                              120, "answering /readyz")
        self.procs.start("kube-controller-manager",
                         control.controller_manager(s, tc.kube("kube-controller-manager"), self.pki_dir, kcm))
        config = control.scheduler_config(s, sched, self.conf / "scheduler.yaml")
        self.procs.start("kube-scheduler", control.scheduler(s, tc.kube("kube-scheduler"), config, sched))

    def _node(self) -> None:
        s, tc = self.settings, self.toolchain
        self._pod_network()
        layouts = ["--oci-layout", str(tc.image.layout)] if tc.image is not None else []
        layouts += [arg for layout in self.extra_layouts for arg in ("--oci-layout", str(layout))]
        if tc.reference is not None:
            layouts += ["--binary-image", f"{PLUGIN_IMAGE}={tc.reference / PLUGIN_BINARY}"]
        for image, program in self.extra_binary_images.items():
            layouts += ["--binary-image", f"{image}={program}"]
        self.procs.start("registry", [sys.executable, "-m", "e2e.registry", "--port", str(s.port(ports.REGISTRY)),
                                      "--busybox", str(tc.busybox), "--pause", str(tc.pause), *layouts], cwd=REPO)
        registry = f"http://127.0.0.1:{s.port(ports.REGISTRY)}/v2/"
        self.procs.wait_ready("registry", lambda: _http_ok(registry), 30, "serving /v2/")
        config = node.containerd_config(s, tc, self.conf / "containerd")
        self.procs.start("containerd", [str(tc.containerd / "containerd"), "--config", str(config)],
                         env=node.containerd_env(tc))
        self.procs.wait_ready("containerd", node.CONTAINERD_SOCKET.exists, 60, "serving its socket")
        serving = (self.pki_dir / "kubelet-serving.crt", self.pki_dir / "kubelet-serving.key")
        kubelet_config = node.kubelet_config(s, self.conf, self.pki_dir / "ca.crt", serving)
        self.kubelet_argv = control.kubelet(tc.kube("kubelet"), s, kubelet_config, self.conf / "kubelet.kubeconfig")
        self.start_kubelet()
        kubectl = self.kubectl()
        self.procs.wait_ready("kubelet", lambda: _node_ready(kubectl, s.node_name), 120, "a Ready node")
        self.start_kube_proxy()

    def _pod_network(self) -> None:
        """The bridge, and the API server reachable from pods through the `kubernetes` Service (e2e.podnet)."""
        s, kubectl = self.settings, self.kubectl()
        podnet.setup(self.run)
        api = s.port(ports.API_SERVER)
        self.procs.start("api-relay", [sys.executable, "-m", "e2e.relay", "--listen", f"{podnet.GATEWAY}:{api}",
                                       "--to", str(api)], cwd=REPO)
        self.procs.wait_ready("api-relay", lambda: _port_open(api, podnet.GATEWAY), 30, "listening")
        for doc in podnet.api_endpoints(s):
            kubectl.ok(["apply", "-f", "-"], stdin=json.dumps(doc))

    def start_kube_proxy(self) -> None:
        """Started once the node exists: it reads the node's addresses first (and waits 30 s for a missing one)."""
        s = self.settings
        binary = self.toolchain.kube("kube-proxy")
        podnet.remember_kube_proxy(self.run, binary)
        config = podnet.kube_proxy_config(s, self.conf / "kube-proxy.kubeconfig", self.conf / "kube-proxy.yaml")
        self.procs.start("kube-proxy", [str(binary), f"--config={config}"])
        healthz = f"http://127.0.0.1:{s.port(ports.KUBE_PROXY_HEALTHZ)}/healthz"
        self.procs.wait_ready("kube-proxy", lambda: _http_ok(healthz), 60, "answering /healthz")

    def start_kubelet(self) -> None:
        self.procs.start("kubelet", self.kubelet_argv, env=node.containerd_env(self.toolchain))

    def kube_proxy_after_node_deleted(self) -> None:
        """kube-proxy exits when its Node is deleted (pkg/proxy/node.go, NodeManager.OnNodeDelete: exitFunc(1)),
        leaving its rules as they were: no Service made after that is routed. On a real node its DaemonSet or its
        unit starts it again; the tier does the same, once the kubelet has registered the Node again."""
        proc = self.procs.procs.get("kube-proxy")
        if proc is not None and proc.alive():
            return
        self.procs.stop("kube-proxy")
        self.start_kube_proxy()

    def _gpushare(self) -> None:
        s, kubectl = self.settings, self.kubectl()
        self.components = gpushare.path_components(kubectl)
        self.docs = gpushare.render(kubectl, components=self.components)
        gpushare.apply(kubectl, gpushare.for_cluster(self.docs, s.port(ports.WEBHOOK)))
        kubectl.ok(["apply", "-f", "-"], stdin=gpushare.EXTENDER_RBAC)
        _run_checked([sys.executable, "-m", "certs.cli", "install", "--namespace", gpushare.NAMESPACE,
                      "--kubeconfig", str(self.admin_kubeconfig), "--extra-host", "127.0.0.1"],
                     "gpushare-certs install")
        self.start_webhook()
        self.start_extender()
        plugin_token = gpushare.token(kubectl, *gpushare.PLUGIN_SA, node=s.node_name)
        kubeconfig(self.conf / "plugin.kubeconfig", self.server, self.pki_dir / "ca.crt", token=plugin_token,
                   user="gpushare-device-plugin")
        self.start_plugin()
        self._default_service_account()

    def _default_service_account(self) -> None:
        # kubectl wait fails at once on an object that does not exist yet: poll for the controller's work.
        self.procs.wait_ready("kube-controller-manager", lambda: self.has("serviceaccount", "default", "default"), 60,
                              "the default ServiceAccount")

    # -- the scheduler extender -----------------------------------------------------------------------

    @property
    def has_extender(self) -> bool:
        """Whether the reference extender runs (its sources were found: toolchain.reference_missing says why not)."""
        return self.toolchain.reference is not None

    def start_extender(self) -> None:
        """The reference scheduler extender with the ServiceAccount of manifests/extender/rbac.yaml (applied with
        the gpushare manifests). Without its sources the scheduler still names it, so GPU-share pods wait
        unscheduled, and the tests that need it are skipped with the line toolchain.reference_missing gives."""
        if self.toolchain.reference is None:
            return
        token = gpushare.token(self.kubectl(), *gpushare.EXTENDER_SA)
        config = kubeconfig(self.conf / "extender.kubeconfig", self.server, self.pki_dir / "ca.crt", token=token,
                            user="gpushare-schd-extender")
        extender.start(self.procs, self.settings, self.toolchain.reference, config, _base_env())

    # -- gpushare processes ---------------------------------------------------------------------------

    def webhook_env(self) -> dict[str, str]:
        kubectl, here = self.kubectl(), self.run / "webhook"
        files = gpushare.secret_files(kubectl, "secret", "gpushare-webhook-tls", here / "tls")
        signing = gpushare.secret_files(kubectl, "secret", "gpushare-signing-key", here / "signing")
        overrides = {
            "GPUSHARE_BIND": f"127.0.0.1:{self.settings.port(ports.WEBHOOK)}",
            "GPUSHARE_METRICS_BIND": f"127.0.0.1:{self.settings.port(ports.WEBHOOK_METRICS)}",
            "GPUSHARE_TLS_CERT": str(files["tls.crt"]), "GPUSHARE_TLS_KEY": str(files["tls.key"]),
            "GPUSHARE_SIGNING_KEY": str(signing["signing.key"]), "GPUSHARE_DELIVERY": self.delivery,
        }
        env = gpushare.workload_env(self.docs, "Deployment", overrides)
        return {**_base_env(), **env}

    def start_webhook(self) -> None:
        env = self.webhook_env()
        self.procs.start("webhook", [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"], env=env, cwd=REPO)
        # As the kubelet does for the Deployment's Secret volume: rotated certificates reach the files in place,
        # some seconds after the Secret changed (the kubelet: its sync period, a minute by default, at most).
        self.procs.start("webhook-tls-volume", [
            sys.executable, "-m", "e2e.volumes", "--kubeconfig", str(self.admin_kubeconfig),
            "--namespace", gpushare.NAMESPACE, "--secret", "gpushare-webhook-tls",
            "--dir", str(Path(env["GPUSHARE_TLS_CERT"]).parent), "--period", "10"], cwd=REPO)
        self.procs.wait_ready("webhook", lambda: _port_open(self.settings.port(ports.WEBHOOK)), 30, "listening")

    def stop_webhook(self) -> None:
        self.procs.stop("webhook-tls-volume")
        self.procs.stop("webhook")

    def cert_manager(self) -> CertManager:
        """Upstream cert-manager against this cluster (not started: call `start()`)."""
        return CertManager(kubectl=self.kubectl(), processes=self.procs, settings=self.settings,
                           release_dir=self.toolchain.cert_manager, server=self.server, ca=self.pki_dir / "ca.crt",
                           serving=self.cert_manager_serving, conf=self.conf)

    def plugin_env(self) -> dict[str, str]:
        verify = gpushare.secret_files(self.kubectl(), "configmap", "gpushare-verify-key",
                                       self.run / "plugin" / "verify")
        overrides = {
            "GPUSHARE_NODE_NAME": self.settings.node_name, "GPUSHARE_FAKE_GPUS": "",  # read the GPUs from NVML
            "GPUSHARE_KUBECONFIG": str(self.conf / "plugin.kubeconfig"),
            "GPUSHARE_VERIFY_KEY": str(verify["signing.pub"]), "GPUSHARE_DELIVERY": self.delivery,
            "GPUSHARE_FAKE_GPU_DIR": str(node.RUN_ROOT / "fake-gpus"),
            "GPUSHARE_METRICS_BIND": f"127.0.0.1:{self.settings.port(ports.PLUGIN_METRICS)}",
        }
        env = gpushare.workload_env(self.docs, "DaemonSet", overrides)
        for name in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"):
            env.pop(name, None)
        return {**_base_env(), **env, **self.nvml_env()}

    def nvml_env(self) -> dict[str, str]:
        """The fake libnvidia-ml.so.1 in place of the real one, serving GPUSHARE_E2E_FAKE_GPUS with the UUIDs the
        tests expect (fake_gpus) and no device nodes (the CDI spec then mounts a file naming the GPU)."""
        s = self.settings
        gpus = fakenvml.gpu_list((g.memory_units, g.uuid, None) for g in fake_gpus(s.fake_gpus, s.node_name, "MiB"))
        try:
            library = fakenvml.build(s.cache_dir / "fakenvml")
        except fakenvml.BuildError as exc:
            raise procs.StartError(str(exc)) from exc
        return fakenvml.environment(library, gpus, self.nvml_events)

    def start_plugin(self, name: str = "device-plugin") -> None:
        """The device plugin as a host process; `name` another than the default starts a second instance beside a
        running one, as a DaemonSet rollout with overlap does."""
        log = self.log(name)
        offset = log.stat().st_size if log.exists() else 0
        env = self.plugin_env()
        if name != "device-plugin":
            env["GPUSHARE_METRICS_BIND"] = ""  # the first instance holds the node's metrics port
        self.procs.start(name, [sys.executable, "-m", "deviceplugin.main"], env=env, cwd=REPO)
        kubectl = self.kubectl()
        # Registered with this kubelet (the plugin logs it once Register returned), and the node shows it.
        self.procs.wait_ready(name, lambda: b"device plugin serving" in log.read_bytes()[offset:], 60,
                              "registered with the kubelet")
        self.procs.wait_ready(name, lambda: _has_capacity(kubectl, self.settings.node_name), 60,
                              "the node advertising aliyun.com/gpu-mem")

    def start_dra(self, server: str | None = None) -> None:
        """The DRA driver (dra/) as a host process with the device plugin's GPUs and its own identity, a
        token of the component's ServiceAccount bound to this node as a pod's projected token is (apply
        manifests/dra first); ready once registered with the kubelet's plugin watcher and its node's ResourceSlices
        are published. `server`: the API server's address as the driver has it (a relay in front of it)."""
        log = self.log("dra-plugin")
        offset = log.stat().st_size if log.exists() else 0
        token = gpushare.token(self.kubectl(), *gpushare.DRA_SA, node=self.settings.node_name)
        kubeconfig(self.dra_kubeconfig, server or self.server, self.pki_dir / "ca.crt", token=token,
                   user=gpushare.DRA_SA[1])
        env = {**self.plugin_env(), "GPUSHARE_DRA_STATE_DIR": str(node.STATE_ROOT / "dra"),
               "GPUSHARE_KUBECONFIG": str(self.dra_kubeconfig),
               "GPUSHARE_METRICS_BIND": f"127.0.0.1:{self.settings.port(ports.DRA_METRICS)}"}
        self.procs.start("dra-plugin", [sys.executable, "-m", "dra.main"], env=env, cwd=REPO)
        self.procs.wait_ready("dra-plugin", lambda: b"gpushare DRA driver serving" in log.read_bytes()[offset:], 60,
                              "serving")
        kubectl = self.kubectl()
        self.procs.wait_ready("dra-plugin", lambda: _has_slice(kubectl, self.settings.node_name), 60,
                              "its node's ResourceSlice published")

    def stop_dra(self) -> None:
        self.procs.stop("dra-plugin")

    def use_delivery(self, delivery: str) -> None:
        """Switch the cluster-wide delivery mode: the ConfigMap, then the webhook and the plugin restarted; on the
        in-process path the policy gpushare-neutralise is there in env delivery only, as the chart renders it."""
        self.delivery = delivery
        kubectl = self.kubectl()
        kubectl.ok(["patch", "configmap", "gpushare-config", "-n", gpushare.NAMESPACE, "--type=merge",
                    "-p", f'{{"data":{{"GPUSHARE_DELIVERY":"{delivery}"}}}}'])
        neutralise = [d for d in self.docs if d["kind"] in gpushare.NEUTRALISE_KINDS]
        if neutralise and delivery == "env":
            gpushare.apply(kubectl, neutralise)
        elif neutralise:
            for doc in neutralise:
                kubectl.ok(["delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found"])
        self.procs.stop("device-plugin")
        self.stop_webhook()
        self.start_webhook()
        self.start_plugin()

    # -- down -----------------------------------------------------------------------------------------

    def down(self) -> None:
        self.procs.stop_all()
        down(self.settings)


def down(settings: E2eSettings) -> list[str]:
    """Stop what any run left, kill pod processes and shims, unmount and remove the node's state."""
    stopped = procs.stop_recorded(settings.run_dir)
    podnet.teardown(settings.run_dir)
    with contextlib.suppress(netns.NetnsError):
        netns.remove(extender.NETNS)
    node.kill_shims()
    killed = node.kill_pod_processes()
    node.unmount_all()
    node.remove_state()
    notes = [f"stopped {', '.join(stopped)}"] if stopped else []
    if killed:
        notes.append(f"killed {killed} container processes")
    return notes


def _has_slice(kubectl: Kubectl, node_name: str) -> bool:
    code, out, _ = kubectl.run(["get", "resourceslices", "-o", "json"], timeout=10)
    return code == 0 and any(s["spec"].get("driver") == DRA_DRIVER and s["spec"].get("nodeName") == node_name
                             for s in json.loads(out)["items"])


def _process_names() -> list[bytes]:
    names = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                names.append((entry / "cmdline").read_bytes().split(b"\0")[0])
            except OSError:
                continue
    return names


def _base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "VIRTUAL_ENV", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if k in keep and not k.startswith("GPUSHARE_")}


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.create_connection((host, port), timeout=1):
        return True


def _node_ready(kubectl: Kubectl, name: str) -> bool:
    code, out, _ = kubectl.run(["get", "node", name, "-o",
                                "jsonpath={.status.conditions[?(@.type=='Ready')].status}"], timeout=10)
    return code == 0 and out.strip() == "True"


def _has_capacity(kubectl: Kubectl, name: str) -> bool:
    code, out, _ = kubectl.run(["get", "node", name, "-o", "jsonpath={.status.allocatable.aliyun\\.com/gpu-mem}"],
                               timeout=10)
    return code == 0 and out.strip() not in ("", "0")


def _run_checked(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    if result.returncode != 0:
        raise procs.StartError(f"{what} failed (exit {result.returncode}): {result.stderr.strip() or result.stdout}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down"])
    args = parser.parse_args(argv)
    settings = from_environ()
    if args.action == "down":
        notes = down(settings)
        print("Cleaned up: " + ("; ".join(notes) if notes else "nothing was left"))
        return 0
    try:
        cluster = Cluster(settings, ensure(settings))
        cluster.up()
    except (ToolchainError, procs.StartError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(f"The cluster is up. kubectl --kubeconfig {cluster.admin_kubeconfig} get nodes\n"
          f"Logs: {cluster.procs.logs}. Stop it with: python -m e2e.cluster down")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The node: containerd (CRI, CDI on, loopback-only CNI), the real kubelet, and leaving nothing behind.

Paths the tier owns: /var/lib/kubelet (the device-plugin directory is fixed there by the kubelet:
k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go), /var/lib/gpushare-e2e, /run/gpushare-e2e, and
/var/lib/gpushare/dra (the DRA driver's checkpoint where the install tier runs its DaemonSet).
Pods get only a loopback interface: the CNI config holds the `loopback` plugin alone, so the runtime
reports its network ready without any address outside the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from dra.settings import DEFAULT_STATE_DIR
from e2e import podnet
from e2e import settings as ports
from e2e.settings import E2eSettings
from e2e.toolchain import Toolchain

KUBELET_DIR = Path("/var/lib/kubelet")
STATE_ROOT = Path("/var/lib/gpushare-e2e")
RUN_ROOT = Path("/run/gpushare-e2e")
CDI_DIR = Path("/var/run/cdi")
CONTAINERD_SOCKET = RUN_ROOT / "containerd" / "containerd.sock"
OWNED_MOUNT_ROOTS = (KUBELET_DIR, STATE_ROOT, RUN_ROOT)
# The node directory manifests/dra mounts for the driver's checkpoint (the driver's default).
DRA_STATE_DIR = Path(DEFAULT_STATE_DIR)


def containerd_config(settings: E2eSettings, toolchain: Toolchain, conf_dir: Path) -> Path:
    """containerd 2.x config (version 3): CRI with CDI, runc with cgroupfs, our registry over plain HTTP, the pod
    network of e2e.podnet."""
    registry = f"127.0.0.1:{settings.port(ports.REGISTRY)}"
    hosts = conf_dir / "certs.d" / registry
    hosts.mkdir(parents=True, exist_ok=True)
    (hosts / "hosts.toml").write_text(
        f'server = "http://{registry}"\n\n[host."http://{registry}"]\n  capabilities = ["pull", "resolve"]\n'
    )
    cni = podnet.cni_config(conf_dir / "cni", RUN_ROOT / "cni-ipam").parent
    config = conf_dir / "containerd.toml"
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    images = "plugins.'io.containerd.cri.v1.images'"
    config.write_text(f"""version = 3
root = "{STATE_ROOT / 'containerd'}"
state = "{RUN_ROOT / 'containerd'}"

[grpc]
  address = "{CONTAINERD_SOCKET}"

[{runtime}]
  enable_cdi = true
  cdi_spec_dirs = ["{CDI_DIR}"]
  netns_mounts_under_state_dir = true
  # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which this machine's root lacks: clamp it to ours.
  restrict_oom_score_adj = true
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{runtime}.containerd.runtimes.runc.options]
        BinaryName = "{toolchain.runc}"
        Root = "{RUN_ROOT / 'runc'}"
        SystemdCgroup = false
  [{runtime}.cni]
    bin_dirs = ["{toolchain.cni_bin}"]
    conf_dir = "{cni}"

[{images}]
  snapshotter = "overlayfs"
  [{images}.pinned_images]
    sandbox = "{registry}/gpushare-e2e/pause:1"
  [{images}.registry]
    config_path = "{conf_dir / 'certs.d'}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
""")
    return config


def kubelet_config(settings: E2eSettings, conf_dir: Path, ca: Path, serving: tuple[Path, Path]) -> Path:
    """KubeletConfiguration v1beta1: cgroupfs on cgroup v1, x509 client auth, no eviction of the tier's pods."""
    config = conf_dir / "kubelet.yaml"
    config.write_text(f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {settings.port(ports.KUBELET)}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {settings.port(ports.KUBELET_HEALTHZ)}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{CONTAINERD_SOCKET}
tlsCertFile: {serving[0]}
tlsPrivateKeyFile: {serving[1]}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {ca}
authorization:
  mode: AlwaysAllow
serializeImagePulls: true
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
resolvConf: ""
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
fileCheckFrequency: 20s
maxPods: 110
oomScoreAdj: 0
""")
    return config


def containerd_env(toolchain: Toolchain) -> dict[str, str]:
    # containerd finds its shim, and the shim runc, on PATH.
    path = f"{toolchain.containerd}:{toolchain.runc.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {**os.environ, "PATH": path}


def _mounts_under(roots: tuple[Path, ...]) -> list[str]:
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = line.split()[4].replace("\\040", " ")
            if any(point == str(r) or point.startswith(str(r) + "/") for r in roots):
                found.append(point)
    return found


def unmount_all(roots: tuple[Path, ...] = OWNED_MOUNT_ROOTS) -> int:
    """Lazily unmount every mount below the tier's roots, deepest first; returns how many."""
    count = 0
    for _ in range(5):  # a lazy unmount can reveal a mount that was below it
        points = sorted(set(_mounts_under(roots)), key=lambda p: p.count("/"), reverse=True)
        if not points:
            break
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
            count += 1
    return count


def _cgroup_dirs() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    dirs = [d / "kubepods" for d in base.iterdir() if (d / "kubepods").is_dir()]
    if (base / "kubepods").is_dir():
        dirs.append(base / "kubepods")
    return dirs


def kill_pod_processes() -> int:
    """SIGKILL every process left in the kubelet's pod cgroups and remove those cgroups; returns the count."""
    pids: set[int] = set()
    for top in _cgroup_dirs():
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, 9)
    time.sleep(0.2 if pids else 0)
    for top in _cgroup_dirs():
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
    return len(pids)


def kill_shims() -> int:
    """SIGKILL the runc shims our containerd started (they leave its process group on purpose)."""
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(CONTAINERD_SOCKET).encode() in argv:
                os.kill(int(entry.name), 9)
                killed += 1
    return killed


def remove_state() -> None:
    """Delete the node's state so the next run starts from nothing (nothing may be mounted any more)."""
    for root in (*OWNED_MOUNT_ROOTS, DRA_STATE_DIR):
        if root.exists() and not _mounts_under((root,)):
            shutil.rmtree(root, ignore_errors=True)
    for spec in CDI_DIR.glob("gpushare-*"):
        spec.unlink(missing_ok=True)

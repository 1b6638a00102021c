"""Upstream binaries for the real-cluster tier, built once from their Go modules and cached by version; the reference
extender and device plugin, built from the sources GPUSHARE_E2E_REFERENCE_SRC names and cached by their contents.

`python -m e2e.toolchain` builds what is missing and prints where everything is; `check()` names what this
machine lacks (Go, root, cgroups, a C compiler) so the tier can be skipped with one line that says why.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.settings import SettingsError
from e2e import projectimage, versions
from e2e.projectimage import ProjectImage
from e2e.settings import E2eSettings, from_environ
from e2e.versions import Release

REPO = Path(__file__).resolve().parents[1]
K8S_SOURCES = REPO / "e2e" / "build" / "k8s"  # tools.go and etcd/; each release's go.mod and go.sum in <version>/
CONTAINERD_SOURCES = REPO / "e2e" / "build" / "containerd"  # tools.go; go.mod and go.sum in <version>/
CERT_MANAGER_MODULE_DIR = REPO / "e2e" / "build" / "cert-manager"
CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager"
PAUSE_SOURCE = REPO / "e2e" / "images" / "pause.c"

RUNC_MODULE = "github.com/opencontainers/runc"
# runc's Makefile (v1.5.2) builds with "seccomp urfave_cli_no_docs libpathrs"; libpathrs is a Rust library Debian 12
# does not ship, and without the tag runc resolves paths with its own Go code (libcontainer/pathrs).
RUNC_BUILD_TAGS = "seccomp urfave_cli_no_docs"
KUBERNETES_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2")
# Debian packages the node needs, and a file each one installs. runc is built from its module at the version the
# release's containerd expects (e2e/versions.py); its seccomp support links libseccomp through cgo.
DEBIAN_PACKAGES = {
    "libseccomp-dev": "/usr/include/seccomp.h",
    "pkg-config": "/usr/bin/pkg-config",
    "containernetworking-plugins": "/usr/lib/cni/loopback",
    "busybox-static": "/bin/busybox",
    "buildah": "/usr/bin/buildah",  # the project's image, from its Dockerfile (e2e.projectimage)
    "mmdebstrap": "/usr/bin/mmdebstrap",  # that image's base, from Debian's packages
}
# The reference programs' source trees (folders of GPUSHARE_E2E_REFERENCE_SRC) and the commits they are clones of.
REFERENCE_TREES = {
    "gpushare-scheduler-extender": "c0b61411cddabd1b19500878ab355afeeae5589e",
    "gpushare-device-plugin": "45fb8b88692250cff2d53cb64b0a41864a5fcaf3",
}
EXTENDER_BINARY = "gpushare-sche-extender"  # its Makefile's build-server target
PLUGIN_BINARY = "gpushare-device-plugin-v2"  # its Dockerfile's name
# Its DaemonSet's image (device-plugin-ds.yaml) under the tier's registry: the built program and its C library.
PLUGIN_IMAGE = "gpushare-e2e/k8s-gpushare-plugin:v2-1.11-aff8a23"
PLUGIN_IMPORT_PATH = "github.com/AliyunContainerService/gpushare-device-plugin"
# Its NVML bindings leave the NVML symbols to the dynamic loader, which needs the executable's symbols exported:
# Go no longer passes -rdynamic to the external linker (golang/go#53579), and without it every NVML call jumps to 0.
PLUGIN_LDFLAGS = "-extldflags=-rdynamic"


class ToolchainError(Exception):
    """A build or install step failed; the text names the step and what to look at."""


@dataclass(frozen=True)
class Toolchain:
    release: Release  # the row of e2e/versions.py these binaries were built for
    kubernetes: Path  # directory with etcd and the five Kubernetes commands
    containerd: Path  # directory with containerd and its runc shim
    pause: Path  # the static pause binary of the sandbox image
    runc: Path
    cni_bin: Path
    busybox: Path
    cert_manager: Path  # directory with the cert-manager command and the release's deploy/ (chart, CRDs)
    reference: Path | None = None  # directory with EXTENDER_BINARY and PLUGIN_BINARY; None without their sources
    image: ProjectImage | None = None  # the project's image, built from its Dockerfile (e2e.projectimage)

    def kube(self, command: str) -> Path:
        return self.kubernetes / command


def check() -> list[str]:
    """What this machine lacks for the tier, one phrase each (empty when it can run)."""
    missing = []
    if shutil.which("go") is None:
        missing.append("the Go toolchain (go) is not on PATH")
    if os.geteuid() != 0:
        missing.append("the tier runs a kubelet and containerd, which need root")
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        missing.append("no memory cgroup is mounted under /sys/fs/cgroup")
    if shutil.which("gcc") is None:
        missing.append("gcc is needed to build the pause image")
    if shutil.which("apt-get") is None and any(not Path(p).exists() for p in DEBIAN_PACKAGES.values()):
        missing.append(f"apt-get is needed to install {', '.join(DEBIAN_PACKAGES)}")
    return missing


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(argv: list[str], what: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    started = time.monotonic()
    result = subprocess.run(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    if result.returncode != 0:
        raise ToolchainError(f"{what} failed (exit {result.returncode}):\n{result.stdout[-4000:]}")
    _say(f"  {what}: done in {time.monotonic() - started:.0f} s")


def _install_debian_packages() -> None:
    wanted = [name for name, path in DEBIAN_PACKAGES.items() if not Path(path).exists()]
    if not wanted:
        return
    _say(f"Installing Debian packages {', '.join(wanted)} ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-qq"], "apt-get update", env=env)
    _run(["apt-get", "install", "-y", "-qq", *wanted], f"apt-get install {' '.join(wanted)}", env=env)


NEWER_GO = "go1.27.3"  # the toolchain a module gets when it needs a newer Go than the machine's


def _go_version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.removeprefix("go").split(".") if part.isdigit())


def _go_env(settings: E2eSettings, module_dir: Path | None = None) -> dict[str, str]:
    """The build's environment; GOTOOLCHAIN names a newer Go where the module's go directive needs one."""
    env = dict(os.environ)
    env["GOFLAGS"] = "-buildvcs=false"
    env["CGO_ENABLED"] = "1"
    if module_dir is not None and (module_dir / "go.mod").exists():
        newer = toolchain_for(go_directive((module_dir / "go.mod").read_text()), env)
        if newer is not None:
            env["GOTOOLCHAIN"] = newer
    return env


def go_directive(go_mod: str) -> str:
    """The Go release a go.mod's `go` line asks for ("" when it has none)."""
    return next((line.split()[1] for line in go_mod.splitlines() if line.startswith("go ")), "")


def toolchain_for(wanted: str, env: dict[str, str]) -> str | None:
    """NEWER_GO where the machine's Go is older than `wanted` (a go directive), else None."""
    local = subprocess.run(["go", "env", "GOVERSION"], env={**env, "GOTOOLCHAIN": "local"},
                           capture_output=True, text=True, check=False).stdout.strip()
    return NEWER_GO if wanted and _go_version_tuple(local) < _go_version_tuple(wanted) else None


def _module_work_dir(sources: Path, pinned: Path, work: Path) -> Path:
    """A build module in `work`: the shared sources (tools.go, etcd/) with a release's pinned go.mod and go.sum."""
    if not (pinned / "go.mod").exists():
        raise ToolchainError(f"{pinned.relative_to(REPO)}/go.mod is missing: run `python -m e2e.versions pin "
                             f"{pinned.name}` for a release of e2e/versions.py")
    shutil.copytree(sources, work, ignore=shutil.ignore_patterns("v[0-9]*"))
    for name in ("go.mod", "go.sum"):
        shutil.copyfile(pinned / name, work / name)
    return work


def _version_ldflags(version: str) -> str:
    # What hack/lib/version.sh stamps: without it the binaries report v0.0.0 and the API server's
    # compatibility version (component-base/compatibility) cannot be derived from the binary version.
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}", f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}", f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(["-s", "-w", *flags])


def _staging(target: Path, what: str) -> Path:
    """Say what is built, and an empty folder beside `target` to build it in (`_publish` moves it there)."""
    _say(f"Building {what} into {target} ...")
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _publish(staging: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def _build_kubernetes(settings: E2eSettings, target: Path) -> None:
    commands = ["etcd", *KUBERNETES_COMMANDS]
    if all((target / c).exists() for c in commands):
        return
    row = settings.release
    staging = _staging(target, f"Kubernetes {row.kubernetes} and etcd {row.etcd} from their Go modules (once; about "
                               "15 minutes on 2 cores)")
    module = _module_work_dir(K8S_SOURCES, versions.k8s_module_dir(row), staging / "module")
    packages = ["./etcd", *[f"k8s.io/kubernetes/cmd/{c}" for c in KUBERNETES_COMMANDS]]
    _run(
        ["go", "build", "-ldflags", _version_ldflags(row.kubernetes), "-o", str(staging), *packages],
        f"go build of etcd and {', '.join(KUBERNETES_COMMANDS)}", cwd=module, env=_go_env(settings, module),
    )
    shutil.rmtree(module)
    _publish(staging, target)


def _build_containerd(settings: E2eSettings, target: Path) -> None:
    if all((target / c).exists() for c in CONTAINERD_COMMANDS):
        return
    row = settings.release
    staging = _staging(target, f"containerd {row.containerd} from its Go module")
    work = _module_work_dir(CONTAINERD_SOURCES, versions.containerd_module_dir(row), staging / "module")
    module = "github.com/containerd/containerd/v2"
    ldflags = f"-s -w -X {module}/version.Version={row.containerd}"
    _run(["go", "build", "-ldflags", ldflags, "-o", str(staging), *[f"{module}/cmd/{c}" for c in CONTAINERD_COMMANDS]],
         f"go build of {', '.join(CONTAINERD_COMMANDS)}", cwd=work, env=_go_env(settings, work))
    shutil.rmtree(work)
    _publish(staging, target)


def _build_runc(settings: E2eSettings, target: Path) -> None:
    """runc at the version the release's containerd expects, with seccomp (cert-manager's pods ask for
    RuntimeDefault), built with `go install module@version` as its go.mod has no replace or exclude directive."""
    if (target / "runc").exists():
        return
    row = settings.release
    staging = _staging(target, f"runc {row.runc} from its Go module")
    env = {**_go_env(settings), "GOBIN": str(staging), "GOFLAGS": "-buildvcs=false -trimpath"}
    _run(["go", "install", "-tags", RUNC_BUILD_TAGS, "-ldflags", "-s -w", f"{RUNC_MODULE}@{row.runc}"],
         f"go install of runc {row.runc}", env=env)
    _publish(staging, target)


def _build_cert_manager(settings: E2eSettings, target: Path) -> None:
    if (target / "cert-manager").exists() and (target / "deploy").is_dir():
        return
    staging = _staging(target, f"cert-manager {settings.cert_manager_version} from its Go module")
    env = _go_env(settings)
    _run(["go", "build", "-ldflags", "-s -w", "-o", str(staging / "cert-manager"), "."],
         "go build of cert-manager (controller, cainjector, webhook)", cwd=CERT_MANAGER_MODULE_DIR, env=env)
    # The release's chart and CRDs come from the same module version as the binary.
    listed = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", CERT_MANAGER_MODULE], cwd=CERT_MANAGER_MODULE_DIR,
                            env=env, capture_output=True, text=True, check=False)
    module_dir = Path(listed.stdout.strip())
    if listed.returncode != 0 or not (module_dir / "deploy" / "charts" / "cert-manager").is_dir():
        raise ToolchainError(f"could not find the cert-manager module's deploy/ folder: {listed.stderr.strip()}")
    shutil.copytree(module_dir / "deploy", staging / "deploy")
    for path in (staging / "deploy").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # the module cache is read-only
    _publish(staging, target)


def _build_pause(target: Path) -> None:
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    _run(["gcc", "-static", "-O2", "-o", str(target), str(PAUSE_SOURCE)], "gcc of the pause binary")


def _reference_layout() -> str:
    trees = " and ".join(f"{name}/" for name in REFERENCE_TREES)
    commits = " and ".join(f"{commit[:8]}…" for commit in REFERENCE_TREES.values())
    return f"a folder with {trees} (clones at commits {commits})"


def reference_missing(settings: E2eSettings) -> str | None:
    """One line saying why the reference programs cannot be built here, or None when they can.

    A variable that names a folder without both trees is not "missing": `build_reference` fails on it, naming what
    is absent, so that a wrong path is fixed rather than skipped."""
    if settings.reference_src is None:
        return ("the reference extender and device plugin sources are not available: set "
                f"GPUSHARE_E2E_REFERENCE_SRC to {_reference_layout()}")
    if shutil.which("go") is None:
        return "the Go toolchain (go) is not on PATH, so the reference extender and device plugin cannot be built"
    return None


def reference_key(source: Path, go_version: str) -> str:
    """16 hex digits of the trees' contents (sorted relative paths and bytes), the Go version and the link flags."""
    digest = hashlib.sha256(f"{go_version}\0{PLUGIN_LDFLAGS}\0".encode())
    for tree in REFERENCE_TREES:
        for path in sorted(p for p in (source / tree).rglob("*") if p.is_symlink() or not p.is_dir()):
            data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            digest.update(f"{path.relative_to(source).as_posix()}\0{path.is_symlink()}\0{len(data)}\0".encode())
            digest.update(data)
    return digest.hexdigest()[:16]


def _writable_copy(source: Path, target: Path) -> None:
    # The sources may be read-only (folders included); the copy must not be, so that it can be removed.
    shutil.copytree(source, target, symlinks=True, copy_function=shutil.copyfile)
    for folder in [target, *(p for p in target.rglob("*") if p.is_dir() and not p.is_symlink())]:
        folder.chmod(0o755)


def build_reference(settings: E2eSettings) -> Path | None:
    """The folder with the reference extender and device plugin built from GPUSHARE_E2E_REFERENCE_SRC (None when
    it is unset), cached by the sources' contents and the Go version."""
    source = settings.reference_src
    if source is None:
        return None
    absent = [name for name in REFERENCE_TREES if not (source / name).is_dir()]
    if absent:
        raise ToolchainError(f"GPUSHARE_E2E_REFERENCE_SRC={source} lacks {' and '.join(f'{n}/' for n in absent)}: "
                             f"it must be {_reference_layout()}")
    env = _go_env(settings)
    env["GOTOOLCHAIN"] = "local"
    version = subprocess.run(["go", "env", "GOVERSION"], env=env, capture_output=True, text=True, check=False)
    if version.returncode != 0:
        raise ToolchainError(f"go env GOVERSION failed: {version.stderr.strip()}")
    target = settings.cache_dir / f"reference-stack-{reference_key(source, version.stdout.strip())}"
    if all((target / binary).is_file() for binary in (EXTENDER_BINARY, PLUGIN_BINARY)):
        return target
    staging = _staging(target, f"the reference extender and device plugin from {source}")
    extender = staging / "work" / "gpushare-scheduler-extender"
    _writable_copy(source / "gpushare-scheduler-extender", extender)
    # Its go.mod and go.sum are complete: the default -mod=readonly builds it and checks every module's hash.
    _run(["go", "build", "-o", str(staging / EXTENDER_BINARY), "./cmd/main.go"],
         f"go build of {EXTENDER_BINARY}", cwd=extender, env=env)
    # No go.mod: GOPATH mode from its vendor/, as its Dockerfile builds it.
    gopath = staging / "work" / "gopath"
    plugin = gopath / "src" / PLUGIN_IMPORT_PATH
    _writable_copy(source / "gpushare-device-plugin", plugin)
    _run(["go", "build", f"-ldflags={PLUGIN_LDFLAGS}", "-o", str(staging / PLUGIN_BINARY), "./cmd/nvidia"],
         f"go build of {PLUGIN_BINARY}", cwd=plugin, env={**env, "GO111MODULE": "off", "GOPATH": str(gopath)})
    shutil.rmtree(staging / "work")
    _publish(staging, target)
    return target


def ensure(settings: E2eSettings) -> Toolchain:
    """Install and build whatever is missing; every step is skipped when its result is already cached."""
    missing = check()
    if missing:
        raise ToolchainError("the real-cluster tier cannot run here: " + "; ".join(missing))
    _install_debian_packages()
    cache = settings.cache_dir
    row = settings.release
    kubernetes = cache / f"kubernetes-{row.kubernetes}-etcd-{row.etcd}"
    containerd = cache / f"containerd-{row.containerd}"
    runc = cache / f"runc-{row.runc}"
    pause = cache / "pause" / "pause"
    cert_manager = cache / f"cert-manager-{settings.cert_manager_version}"
    _build_kubernetes(settings, kubernetes)
    _build_containerd(settings, containerd)
    _build_runc(settings, runc)
    _build_cert_manager(settings, cert_manager)
    _build_pause(pause)
    reference = build_reference(settings)
    try:
        image = projectimage.build(settings)
    except projectimage.ImageError as exc:
        raise ToolchainError(str(exc)) from None
    return Toolchain(
        release=row, kubernetes=kubernetes, containerd=containerd, pause=pause, runc=runc / "runc",
        cni_bin=Path(DEBIAN_PACKAGES["containernetworking-plugins"]).parent,
        busybox=Path(DEBIAN_PACKAGES["busybox-static"]), cert_manager=cert_manager, reference=reference,
        image=image,
    )


SKIPPED = 3  # the exit status that tells ./dev e2e the tier cannot run on this machine


def main() -> int:
    missing = check()
    if missing:
        _say("real-cluster tier skipped: " + "; ".join(missing))
        return SKIPPED
    try:
        toolchain = ensure(from_environ())
    except (ToolchainError, SettingsError) as exc:
        _say(str(exc))
        return 1
    for name, path in vars(toolchain).items():
        print(f"{name}: {path.kubernetes if isinstance(path, Release) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Kubernetes releases the real-cluster tier runs, and everything that differs between them, in one table.

Each row is read from the upstream sources of that release (the Go module cache after `go mod download`):

- etcd: `build/dependencies.yaml`, entry "etcd", of k8s.io/kubernetes at that version.
- containerd: the newest containerd release whose `RELEASES.md` ("Kubernetes Support") lists that minor; runc: that
  containerd's `script/setup/runc-version`.
- gates: `pkg/features/kube_features.go` of that version. `DRAConsumableCapacity` is alpha (off) in 1.35 and beta
  (on) from 1.36; the tier passes a gate only where the release needs it on and still knows it, because a component
  refuses to start on a gate it does not know (`SidecarContainers` is gone in 1.37, CHANGELOG-1.37 #137755).
- `MutatingAdmissionPolicy` at `admissionregistration.k8s.io/v1`: GA and served by default from 1.36.
- controllers the tier turns off: cmd/kube-controller-manager/app/*.go of that version. 1.37 has no cloud
  controllers left (`service-lb-controller` and `cloud-node-lifecycle` are unknown names there, and the controller
  manager refuses to start on an unknown name).

The pinned build modules of each row are in e2e/build/k8s/<version>/ and e2e/build/containerd/<version>/
(`python -m e2e.versions pin VERSION` writes them for a new row).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "e2e" / "build"


@dataclass(frozen=True)
class Release:
    kubernetes: str  # the k8s.io/kubernetes module version, v1.N.P
    etcd: str  # go.etcd.io/etcd/server/v3 version: the release's build/dependencies.yaml
    containerd: str  # github.com/containerd/containerd/v2 version supporting this minor (its RELEASES.md)
    runc: str  # github.com/opencontainers/runc version that containerd expects (script/setup/runc-version)
    # Feature gates the API server, scheduler and controller manager need for the tier's tests (none where the
    # release has them on by default).
    control_gates: tuple[str, ...] = ()
    # Controllers of kube-controller-manager the tier turns off: nothing cloud-like here (no node IPAM, no Service
    # load balancers, no persistent volumes); only names the release knows.
    disabled_controllers: tuple[str, ...] = ("nodeipam", "persistentvolume-binder")
    mutating_admission_policy_v1: bool = False  # admissionregistration.k8s.io/v1 MutatingAdmissionPolicy served

    @property
    def minor(self) -> int:
        return int(self.kubernetes.split(".")[1])

    @property
    def staging(self) -> str:
        """The version of the published staging modules (k8s.io/api, ...) of this release: v0.N.P."""
        return "v0" + self.kubernetes[len("v1"):]

    def controllers_flag(self) -> str:
        return "--controllers=" + ",".join(["*", *(f"-{name}" for name in self.disabled_controllers)])

    def feature_gates_flag(self) -> list[str]:
        return [f"--feature-gates={','.join(self.control_gates)}"] if self.control_gates else []


_CLOUD_CONTROLLERS = ("service-lb-controller", "cloud-node-lifecycle")  # in the controller manager until 1.36

RELEASES: tuple[Release, ...] = (
    Release("v1.35.4", etcd="v3.6.6", containerd="v2.2.9", runc="v1.3.6",
            control_gates=("DRAConsumableCapacity=true",),
            disabled_controllers=("nodeipam", *_CLOUD_CONTROLLERS, "persistentvolume-binder")),
    Release("v1.36.3", etcd="v3.6.8", containerd="v2.3.7", runc="v1.5.2", mutating_admission_policy_v1=True,
            disabled_controllers=("nodeipam", *_CLOUD_CONTROLLERS, "persistentvolume-binder")),
    Release("v1.37.2", etcd="v3.7.0", containerd="v2.4.2", runc="v1.5.2", mutating_admission_policy_v1=True),
)
DEFAULT = RELEASES[-1].kubernetes  # CI runs the tier on the newest; the matrix on every row


class UnknownRelease(ValueError):
    pass


def release(version: str) -> Release:
    """The row of `version` (v1.N.P; a missing leading v is accepted), or an error naming the supported ones."""
    wanted = version if version.startswith("v") else "v" + version
    for row in RELEASES:
        if row.kubernetes == wanted:
            return row
    known = ", ".join(r.kubernetes for r in RELEASES)
    raise UnknownRelease(
        f"Kubernetes {version} is not in the tier's table (e2e/versions.py); supported: {known}. To add a release "
        "the Go module proxy serves, add its row there and run `python -m e2e.versions pin VERSION`."
    )


# -- pinned build modules ---------------------------------------------------------------------------------------

def k8s_module_dir(row: Release) -> Path:
    return BUILD / "k8s" / row.kubernetes


def containerd_module_dir(row: Release) -> Path:
    return BUILD / "containerd" / row.containerd


_STAGING = re.compile(r"^\s*(k8s\.io/[A-Za-z0-9_.-]+) => \./staging/", re.MULTILINE)


def k8s_go_mod(row: Release, upstream_go_mod: str) -> str:
    """The build module's go.mod: k8s.io/kubernetes and etcd's server at the release's versions, and every staging
    module k8s.io/kubernetes replaces with a local path replaced by its published version (v0.N.P)."""
    go = re.search(r"^go (\S+)$", upstream_go_mod, re.MULTILINE)
    godebug = re.search(r"^godebug (\S+)$", upstream_go_mod, re.MULTILINE)
    if go is None:
        raise ValueError("k8s.io/kubernetes' go.mod has no go directive")
    replaces = "".join(f"\t{name} => {name} {row.staging}\n" for name in sorted(set(_STAGING.findall(upstream_go_mod))))
    return (
        "// Build module for the real-cluster tier: upstream Kubernetes and etcd binaries from their Go modules\n"
        "// (written by `python -m e2e.versions pin`). k8s.io/kubernetes replaces its staging modules with local\n"
        "// paths; a module that requires it must replace each one with the published version of the same release.\n"
        f"module gpushare.local/e2e/k8s\n\ngo {go.group(1)}\n\n"
        + (f"godebug {godebug.group(1)}\n\n" if godebug else "")
        + f"require (\n\tgo.etcd.io/etcd/server/v3 {row.etcd}\n\tk8s.io/kubernetes {row.kubernetes}\n)\n\n"
        + f"replace (\n{replaces})\n"
    )


def containerd_go_mod(row: Release, upstream_go_mod: str) -> str:
    """containerd's build module: it requires containerd and repeats its exclude directives, if any (`go install
    ...@version` refuses a module whose go.mod has them)."""
    go = re.search(r"^go (\S+)$", upstream_go_mod, re.MULTILINE)
    if go is None:
        raise ValueError("containerd's go.mod has no go directive")
    exclude = re.search(r"^exclude \((.*?)^\)", upstream_go_mod, re.MULTILINE | re.DOTALL)
    return (
        "// Build module for the real-cluster tier's container runtime: containerd and its runc shim\n"
        "// (written by `python -m e2e.versions pin`).\n"
        f"module gpushare.local/e2e/containerd\n\ngo {go.group(1)}\n\n"
        f"require github.com/containerd/containerd/v2 {row.containerd}\n"
        + (f"\nexclude ({exclude.group(1)})\n" if exclude else "")
    )


def _module_dir(module: str, version: str) -> Path:
    listed = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True,
                            text=True, check=False)
    match = re.search(r'"Dir": "([^"]+)"', listed.stdout)
    if listed.returncode != 0 or match is None:
        raise RuntimeError(f"go mod download {module}@{version} failed: {listed.stdout[-2000:]}{listed.stderr}")
    return Path(match.group(1))


def _tidy(go_mod: str, sources: Path, target: Path) -> None:
    """go mod tidy of `go_mod` beside the shared sources (tools.go, etcd/), keeping go.mod and go.sum in `target`."""
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "module"
        shutil.copytree(sources, folder, ignore=shutil.ignore_patterns("v*"))
        (folder / "go.mod").write_text(go_mod)
        tidy = subprocess.run(["go", "mod", "tidy"], cwd=folder, capture_output=True, text=True, check=False)
        if tidy.returncode != 0:
            raise RuntimeError(f"go mod tidy failed: {tidy.stderr[-4000:]}")
        target.mkdir(parents=True, exist_ok=True)
        for name in ("go.mod", "go.sum"):
            shutil.copyfile(folder / name, target / name)


def pin(row: Release) -> list[Path]:
    """Write the row's pinned build modules (go.mod and go.sum of Kubernetes with etcd, and of containerd)."""
    k8s = _module_dir("k8s.io/kubernetes", row.kubernetes)
    _tidy(k8s_go_mod(row, (k8s / "go.mod").read_text()), BUILD / "k8s", k8s_module_dir(row))
    containerd = _module_dir("github.com/containerd/containerd/v2", row.containerd)
    _tidy(containerd_go_mod(row, (containerd / "go.mod").read_text()), BUILD / "containerd",
          containerd_module_dir(row))
    return [k8s_module_dir(row), containerd_module_dir(row)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.versions", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the table, one release a line")
    pin_cmd = sub.add_parser("pin", help="write the pinned build modules of a release of the table")
    pin_cmd.add_argument("version")
    args = parser.parse_args(argv)
    if args.command == "list":
        for row in RELEASES:
            default = "  (default)" if row.kubernetes == DEFAULT else ""
            print(f"{row.kubernetes}  etcd {row.etcd}  containerd {row.containerd}  runc {row.runc}  "
                  f"gates {','.join(row.control_gates) or '-'}{default}")
        return 0
    try:
        written = pin(release(args.version))
    except (UnknownRelease, RuntimeError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    for folder in written:
        print(f"wrote {folder.relative_to(REPO)}/go.mod and go.sum")
    return 0


if __name__ == "__main__":
    sys.exit(main())

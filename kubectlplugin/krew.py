"""The krew release of `kubectl gpushare`: its archive (the wheel and a launcher) and its Plugin manifest.

A release step runs, from a checkout (docs/kubectl-plugin.md):

    python -m kubectlplugin.krew --build --archive dist/kubectl-gpushare.tar.gz --out dist/gpushare.yaml \\
        --uri https://.../kubectl-gpushare.tar.gz

This is release tooling: the kubectl-gpushare distribution does not ship it (packaging/kubectl-gpushare).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGING = Path("packaging") / "kubectl-gpushare"
NAME = "gpushare"  # krew's name for it: `kubectl krew install gpushare`, run as `kubectl gpushare`
LAUNCHER = "kubectl-gpushare"
WHEEL_PREFIX = "kubectl_gpushare-"
# krew's plugin manifest format (sigs.k8s.io/krew pkg/constants: CurrentAPIVersion, PluginKind).
API_VERSION = "krew.googlecontainertools.github.com/v1alpha2"
REQUIREMENT = "python3 (3.11 or newer) with the kubernetes Python client"

# The archive's executable: Python runs the wheel beside it from its zip (the plugin is pure Python and reads no data
# file of its own). Written for any python3, so that an old one gets a sentence rather than a syntax error.
LAUNCHER_TEXT = '''\
#!/usr/bin/env python3
"""kubectl gpushare, as krew installs it: the kubectl-gpushare wheel beside this file, run by python3."""
import glob
import importlib.util
import os
import sys

if sys.version_info < (3, 11):
    sys.exit("error: kubectl gpushare needs Python 3.11 or newer, and python3 is %d.%d; install a newer python3, "
             "or install the plugin into one with pip install kubectl-gpushare." % sys.version_info[:2])
HERE = os.path.dirname(os.path.realpath(__file__))  # krew links the command to this file
WHEELS = sorted(glob.glob(os.path.join(HERE, "kubectl_gpushare-*.whl")))
if not WHEELS:
    sys.exit("error: The kubectl-gpushare wheel is missing from %s; reinstall the plugin with "
             "kubectl krew reinstall gpushare." % HERE)
sys.path.insert(0, WHEELS[-1])
MISSING = [m for m in ("kubernetes", "yaml", "urllib3") if importlib.util.find_spec(m) is None]
if MISSING:
    sys.exit("error: kubectl gpushare needs the kubernetes Python client, and %s has no %s; install it with "
             "%s -m pip install 'kubernetes>=34.1'." % (sys.executable, ", ".join(MISSING), sys.executable))
from kubectlplugin.cli import main  # noqa: E402

sys.exit(main())
'''


def project_version(root: Path = ROOT) -> str:
    """The one version source: the [project] version of the repository's pyproject.toml."""
    version: str = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    return version


def build_wheel(out_dir: Path, root: Path = ROOT) -> Path:
    """Build the kubectl-gpushare wheel of the checkout at `root` into `out_dir` with pip (setuptools must be
    installed: the build is not isolated, so it needs no package index)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--wheel-dir", str(out_dir), str(root / PACKAGING)],
                   check=True, cwd=root)
    (wheel,) = out_dir.glob(f"{WHEEL_PREFIX}*.whl")
    return wheel


def _member(archive: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)  # no owner and time of this machine: the same wheel gives the same archive
    info.size, info.mode, info.mtime = len(data), mode, 0
    archive.addfile(info, io.BytesIO(data))


def write_archive(wheel: Path, out: Path, root: Path = ROOT) -> str:
    """The krew archive (a tar.gz of the launcher, the wheel and the licence) at `out`; returns its sha256."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        _member(archive, LAUNCHER, LAUNCHER_TEXT.encode(), 0o755)
        _member(archive, wheel.name, wheel.read_bytes(), 0o644)
        _member(archive, "LICENSE", (root / "LICENSE").read_bytes(), 0o644)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))
    return sha256(out)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def archived_version(archive: Path) -> str:
    """The version of the wheel inside a krew archive (its file name: kubectl_gpushare-VERSION-py3-none-any.whl)."""
    with tarfile.open(archive) as opened:
        wheels = [m.name for m in opened.getmembers() if m.name.startswith(WHEEL_PREFIX) and m.name.endswith(".whl")]
    if len(wheels) != 1:
        raise ValueError(f"the archive {archive} holds {len(wheels)} kubectl-gpushare wheels, not one; "
                         "write it again with --build or --wheel")
    return wheels[0][len(WHEEL_PREFIX):].split("-")[0]


def manifest(version: str, uri: str, digest: str) -> dict[str, Any]:
    """The krew Plugin manifest of one release: `uri` is where the archive is downloaded, `digest` its sha256."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Plugin",
        "metadata": {"name": NAME},
        "spec": {
            "version": f"v{version.removeprefix('v')}",
            "shortDescription": "Show every shared GPU and the pods promised to it",
            "description": (
                "kubectl gpushare shows every GPU of a cluster that shares GPU memory with gpushare (or the\n"
                "reference scheduler extender and device plugin): its memory, what was promised on it and to\n"
                "which pods, what was allocated, and why a pod was refused. It reads nodes, pods, Events and\n"
                "ResourceClaims only.\n\n"
                f"It is a Python program: it needs {REQUIREMENT}.\n"
            ),
            "caveats": (
                f"This plugin needs {REQUIREMENT} on PATH:\n\n"
                "  python3 -m pip install 'kubernetes>=34.1'\n\n"
                "Or install it with pip instead of krew: pip install kubectl-gpushare\n"
            ),
            "platforms": [{
                "selector": {"matchExpressions": [{"key": "os", "operator": "In", "values": ["linux", "darwin"]}]},
                "uri": uri,
                "sha256": digest,
                "files": [{"from": "*", "to": "."}],
                "bin": LAUNCHER,
            }],
        },
    }


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(prog="python -m kubectlplugin.krew", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    out.add_argument("--archive", type=Path, required=True, help="the krew archive (.tar.gz): read, or written "
                     "first with --build or --wheel")
    out.add_argument("--out", type=Path, required=True, help="where to write the Plugin manifest (YAML)")
    source = out.add_mutually_exclusive_group()
    source.add_argument("--build", action="store_true", help="build the wheel from this checkout and write the "
                        "archive")
    source.add_argument("--wheel", type=Path, help="write the archive from this kubectl-gpushare wheel")
    out.add_argument("--version", default="", help="the release's version (default: pyproject.toml's); it must be "
                     "the archived wheel's")
    out.add_argument("--uri", default="", help="where the archive will be downloaded from (default: a file:// URI "
                     "of --archive, for `kubectl krew install --manifest=FILE --archive=ARCHIVE`)")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    version = (args.version or project_version()).removeprefix("v")
    try:
        if args.build or args.wheel:
            with tempfile.TemporaryDirectory() as scratch:
                write_archive(args.wheel or build_wheel(Path(scratch)), args.archive)
        archived = archived_version(args.archive)
        if archived != version:
            raise ValueError(f"the archive {args.archive} holds version {archived}, not {version}; pass "
                             f"--version {archived} or write the archive again")
        digest = sha256(args.archive)
    except (OSError, ValueError, tarfile.TarError, subprocess.CalledProcessError) as exc:
        text = str(exc)
        print(f"error: {text[:1].upper()}{text[1:]}", file=sys.stderr)
        return 1
    uri = args.uri or args.archive.resolve().as_uri()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(manifest(version, uri, digest), sort_keys=False, width=1 << 16))
    print(f"{args.out}: kubectl-gpushare v{version}, archive {args.archive} (sha256 {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

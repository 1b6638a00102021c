"""The project's image, built from its Dockerfile as it is, without a Docker daemon, for the real-cluster tier.

No public registry is reachable here, so the Dockerfile's base (its PYTHON_IMAGE build argument) is made from
Debian's packages: a bookworm root file system with python3.11, python3-venv and python-is-python3 (`mmdebstrap`,
with the machine's own apt sources given on its standard input), imported into Debian's `buildah`, which then
builds the Dockerfile. Inside the build `pip` uses the machine's own package configuration, mounted read-only at
build time (`/etc/pip.conf` and the CA certificates it names); no registry host is written anywhere. The image is
pushed to an OCI layout that the tier's registry serves (e2e.registry), as `gpushare-e2e/gpushare:<key>`.

Both steps are cached by what goes into them: the base by the package list and the apt sources, the image by the
Dockerfile, every file the build context admits (.dockerignore) and the base. buildah keeps its storage under the
tier's cache (`--root`), not in the machine's /var/lib/containers.

    python -m e2e.projectimage      # build what is missing and print the layout and the tag
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from e2e.settings import E2eSettings, from_environ

REPO = Path(__file__).resolve().parents[1]
SUITE = "bookworm"
BASE_PACKAGES = ("python3.11", "python3-venv", "python-is-python3", "ca-certificates")
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
PIP_CONFIG = (Path("/etc/pip.conf"), Path("/etc/ssl/certs"))  # mounted into the build's RUN steps when present
REPOSITORY = "gpushare-e2e/gpushare"  # in the tier's registry
# The registry serves each image under a second tag too, `<tag>-upgrade`: the same digest under another name, so that
# an upgrade test changes the pods' image as a new release does (a new ReplicaSet, a rolling update).
UPGRADE_SUFFIX = "-upgrade"
# The build context's own filter: the Dockerfile copies exactly these (and .dockerignore lets in only these).
CONTEXT = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "LICENSE", "gunicorn.conf.py",
           "common", "contract", "webhook", "node", "deviceplugin", "dra", "certs", "kubectlplugin")
_SKIP = ("__pycache__", ".pyc", ".mypy_cache")


class ImageError(Exception):
    """The image could not be built; the text names the step and ends with its output."""


@dataclass(frozen=True)
class ProjectImage:
    layout: Path  # an OCI image layout holding the image
    tag: str  # its tag there and in the registry

    @property
    def repository(self) -> str:
        return REPOSITORY


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(argv: list[str], what: str, stdin: bytes | None = None) -> str:
    started = time.monotonic()
    result = subprocess.run(argv, input=stdin, capture_output=True, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).decode(errors="replace")
        raise ImageError(f"{what} failed (exit {result.returncode}):\n{output[-4000:]}")
    _say(f"  {what}: done in {time.monotonic() - started:.0f} s")
    return result.stdout.decode(errors="replace")


def apt_sources() -> bytes:
    """The machine's apt sources (one-line and deb822 files alike), for mmdebstrap's standard input."""
    parts: list[bytes] = []
    for place in APT_SOURCES:
        files = sorted(place.glob("*.list")) + sorted(place.glob("*.sources")) if place.is_dir() else [place]
        for path in files:
            if path.is_file():
                parts.append(path.read_bytes().rstrip(b"\n") + b"\n")
    return b"\n".join(parts)


def context_files(repo: Path = REPO) -> list[Path]:
    """Every file of the build context the Dockerfile can see, sorted."""
    out: list[Path] = []
    for name in CONTEXT:
        path = repo / name
        items = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out += [p for p in items if not any(part.endswith(_SKIP) for part in p.parts)]
    return out


def key_of(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:16]


def base_key(sources: bytes) -> str:
    return key_of(SUITE.encode(), " ".join(BASE_PACKAGES).encode(), sources)


def image_key(base: str, repo: Path = REPO) -> str:
    files = context_files(repo)
    return key_of(base.encode(), *(p.relative_to(repo).as_posix().encode() + b"\0" + p.read_bytes() for p in files))


def _buildah(settings: E2eSettings) -> list[str]:
    storage = settings.cache_dir / "buildah"
    return ["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run")]


def _has_image(settings: E2eSettings, name: str) -> bool:
    result = subprocess.run([*_buildah(settings), "images", "--quiet", name], capture_output=True, check=False)
    return result.returncode == 0 and bool(result.stdout.strip())


def _base(settings: E2eSettings) -> str:
    """The base image's name in buildah's storage, made from Debian's packages where missing."""
    sources = apt_sources()
    key = base_key(sources)
    name = f"localhost/gpushare-e2e/python:{key}"
    if _has_image(settings, name):
        return name
    rootfs = settings.cache_dir / "python-base" / f"{key}.tar"
    if not rootfs.is_file():
        rootfs.parent.mkdir(parents=True, exist_ok=True)
        partial = rootfs.with_suffix(".partial")
        _say(f"Making a Debian {SUITE} root file system with {', '.join(BASE_PACKAGES)} (mmdebstrap) ...")
        _run(["mmdebstrap", "--quiet", "--mode=root", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
              "--format=tar", SUITE, str(partial), "-"], "mmdebstrap", stdin=sources)
        partial.rename(rootfs)
    buildah = _buildah(settings)
    container = _run([*buildah, "from", "scratch"], "buildah from scratch").strip()
    try:
        _run([*buildah, "add", "--quiet", container, str(rootfs), "/"], "buildah add of the root file system")
        _run([*buildah, "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "--cmd", "python", container], "buildah config")
        _run([*buildah, "commit", "--quiet", container, name], "buildah commit of the base")
    finally:
        subprocess.run([*buildah, "rm", container], capture_output=True, check=False)
    return name


def build(settings: E2eSettings) -> ProjectImage:
    """The image of the repository as it is now, built where missing; an OCI layout the registry can serve."""
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        raise ImageError(f"{' and '.join(missing)} not found: install Debian's {' and '.join(missing)} "
                         "(apt-get install buildah mmdebstrap)")
    base = _base(settings)
    tag = image_key(base.rsplit(":", 1)[1])
    layout = settings.cache_dir / "project-image" / tag
    if (layout / "index.json").is_file():
        return ProjectImage(layout, tag)
    buildah = _buildah(settings)
    mounts = [arg for path in PIP_CONFIG if path.exists() for arg in ("--volume", f"{path}:{path}:ro")]
    name = f"localhost/gpushare:{tag}"
    _say(f"Building the project's image from its Dockerfile (buildah, base {base}) ...")
    # RUN steps in a chroot: no OCI runtime (Debian's buildah pulls in crun, which refuses this host's hybrid cgroups:
    # "cgroups in hybrid mode not supported"), and nothing of the build needs a container's isolation.
    _run([*buildah, "bud", "--quiet", "--layers=false", "--isolation=chroot", "--network=host", *mounts,
          "--build-arg", f"PYTHON_IMAGE={base}", "--file", str(REPO / "Dockerfile"), "--tag", name, str(REPO)],
         "buildah bud of Dockerfile")
    partial = layout.with_name(layout.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        _run([*buildah, "push", "--quiet", name, f"oci:{partial}:{tag}"], "buildah push to an OCI layout")
    finally:
        # The layout is the cache: buildah's copy and the layouts of earlier trees (123 MB each) go.
        subprocess.run([*buildah, "rmi", name], capture_output=True, check=False)
    partial.rename(layout)
    for other in layout.parent.iterdir():
        if other != layout:
            shutil.rmtree(other, ignore_errors=True)
    return ProjectImage(layout, tag)


def manifest_of(layout: Path, tag: str) -> bytes:
    """The manifest the layout's index names for `tag` (org.opencontainers.image.ref.name)."""
    index = json.loads((layout / "index.json").read_text())
    for entry in index.get("manifests") or []:
        if (entry.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag:
            algorithm, hexdigest = str(entry["digest"]).split(":", 1)
            return (layout / "blobs" / algorithm / hexdigest).read_bytes()
    raise ImageError(f"the OCI layout {layout} holds no image tagged {tag}")


def main() -> int:
    try:
        built = build(from_environ())
    except ImageError as exc:
        _say(str(exc))
        return 1
    print(f"layout: {built.layout}\ntag: {built.tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

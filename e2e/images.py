"""OCI images built from local files: a busybox test image, a pause image, and per-tag slow variants.

Every image is a manifest, a config and gzip'd tar layers, held in memory as blobs by digest, exactly what
a registry serves. The test image prints what the container received (see `REPORT`) and then sleeps.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# busybox applets the test containers use.
APPLETS = ("sh", "echo", "cat", "sleep", "env", "ls", "printf", "true", "grep", "tr", "date")


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Layer:
    blob: bytes  # gzip'd tar
    diff_id: str  # digest of the uncompressed tar


def layer(files: dict[str, tuple[bytes, int]], links: dict[str, str] | None = None) -> Layer:
    """A layer with regular files (path -> (content, mode)) and symlinks (path -> target)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*files, *(links or {})]} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(content), mode
            tar.addfile(info, io.BytesIO(content))
        for path, target in sorted((links or {}).items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
    data = raw.getvalue()
    # mtime=0: the same files always give the same digest, so the cache of a registry stays valid.
    return Layer(gzip.compress(data, mtime=0), digest(data))


@dataclass
class Image:
    manifest: bytes
    blobs: dict[str, bytes] = field(default_factory=dict)  # config and layers by digest

    @property
    def digest(self) -> str:
        return digest(self.manifest)


def image(layers: list[Layer], *, entrypoint: list[str] | None = None, cmd: list[str] | None = None,
          env: list[str] | None = None) -> Image:
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": env or ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [item.diff_id for item in layers]},
    }, sort_keys=True).encode()
    blobs = {digest(config): config, **{digest(item.blob): item.blob for item in layers}}
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": LAYER, "digest": digest(item.blob), "size": len(item.blob)} for item in layers],
    }, sort_keys=True).encode()
    return Image(manifest, blobs)


def busybox_layer(busybox: Path) -> Layer:
    links = {f"bin/{name}": "busybox" for name in APPLETS}
    return layer({"bin/busybox": (busybox.read_bytes(), 0o755), "tmp/.keep": (b"", 0o644)}, links)


def pause_image(pause: Path) -> Image:
    return image([layer({"pause": (pause.read_bytes(), 0o755)})], entrypoint=["/pause"])


def binary_image(binary: Path, loader_paths: dict[str, Path]) -> Image:
    """One program at /usr/bin/<its name>, with the files its loader needs (image path -> host file: the C library
    and the loader itself, from `ldd`; none for a static program), and a /tmp: what a Go program runs on."""
    files = {f"usr/bin/{binary.name}": (binary.read_bytes(), 0o755), "tmp/.keep": (b"", 0o644)}
    files.update({path.lstrip("/"): (host.read_bytes(), 0o755) for path, host in loader_paths.items()})
    return image([layer(files)], env=["PATH=/usr/bin:/bin"])


def tag_layer(tag: str) -> Layer:
    """A small layer unique to a tag, so that every slow tag is a fresh pull (containerd shares blobs)."""
    return layer({"etc/gpushare-e2e-tag": (tag.encode() + b"\n", 0o644)})


def test_image(base: Layer, tag: str, *, env: list[str] | None = None) -> Image:
    return image([base, tag_layer(tag)], cmd=["sh"], env=["PATH=/bin", *(env or [])])


# What every test container runs: one line a test can parse from `kubectl logs`, then sleep until deleted.
REPORT = (
    'echo "gpushare-e2e container=$GPUSHARE_E2E_CONTAINER visible=${NVIDIA_VISIBLE_DEVICES-<unset>}'
    ' idx=${ALIYUN_COM_GPU_MEM_IDX-<unset>} slot=${GPUSHARE_SLOT-<unset>}'
    ' mount=$(cat /run/gpushare/gpu 2>/dev/null | tr "\\n" " " || true)"'
)

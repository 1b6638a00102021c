"""The files of a release, by name, and the two it writes itself: the image's OCI archive (the built image with the
release's labels) and SHA256SUMS."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.projectimage import manifest_of

REF_NAME = "org.opencontainers.image.ref.name"  # image-spec annotations.md: the tag of an index entry
VERSION_LABEL = "org.opencontainers.image.version"
REVISION_LABEL = "org.opencontainers.image.revision"
SUMS = "SHA256SUMS"


@dataclass(frozen=True)
class Artifacts:
    """Where each artifact of `version` lies in the release folder `out` (dist/release/<version>/)."""

    out: Path
    version: str

    @property
    def image(self) -> Path:
        return self.out / f"gpushare-{self.version}.oci.tar"

    @property
    def chart(self) -> Path:
        return self.out / f"gpushare-{self.version}.tgz"  # the name `helm package` gives it

    @property
    def sbom(self) -> Path:
        return self.out / f"gpushare-{self.version}.cdx.json"

    @property
    def changelog(self) -> Path:
        return self.out / f"CHANGELOG-{self.version}.md"

    @property
    def kubectl_wheel(self) -> Path:
        return self.out / f"kubectl_gpushare-{self.version}-py3-none-any.whl"  # the name pip's wheel build gives it

    @property
    def kubectl_archive(self) -> Path:
        return self.out / f"kubectl-gpushare-{self.version}.tar.gz"

    @property
    def krew_manifest(self) -> Path:
        return self.out / f"gpushare-krew-{self.version}.yaml"

    @property
    def sums(self) -> Path:
        return self.out / SUMS

    def built(self) -> list[Path]:
        """Every artifact in the folder but SHA256SUMS, sorted: the fixed ones and what other steps added."""
        return sorted(p for p in self.out.iterdir() if p.is_file() and p.name != SUMS and not p.name.startswith("."))


def _blob(layout: Path, digest: str) -> bytes:
    algorithm, hexdigest = digest.split(":", 1)
    return (layout / "blobs" / algorithm / hexdigest).read_bytes()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, source: Path | None = None) -> None:
    """One entry owned by root with the time 0, so the archive depends on the image only."""
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if data is None and source is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        return
    info.mode = 0o644
    if source is not None:
        info.size = source.stat().st_size
        with source.open("rb") as file:
            tar.addfile(info, file)
    else:
        assert data is not None
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def write_oci_archive(layout: Path, tag: str, target: Path, new_tag: str, labels: dict[str, str]) -> str:
    """The image `tag` of the OCI layout, with `labels` added to its configuration, as an OCI archive (a tar of an
    image layout, what `buildah push IMAGE oci-archive:FILE:TAG` writes) that names it `new_tag`. The layers are the
    layout's own files, unchanged. Returns the new manifest's digest."""
    manifest: dict[str, Any] = json.loads(manifest_of(layout, tag))
    config: dict[str, Any] = json.loads(_blob(layout, manifest["config"]["digest"]))
    config.setdefault("config", {})
    config["config"]["Labels"] = {**(config["config"].get("Labels") or {}), **labels}
    config_bytes = json.dumps(config, separators=(",", ":")).encode()
    manifest["config"] = {**manifest["config"], "digest": _digest(config_bytes), "size": len(config_bytes)}
    manifest_bytes = json.dumps(manifest, separators=(",", ":")).encode()
    digest = _digest(manifest_bytes)
    index = {"schemaVersion": 2, "manifests": [{"mediaType": manifest["mediaType"], "digest": digest,
                                                "size": len(manifest_bytes), "annotations": {REF_NAME: new_tag}}]}
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "blobs")
        _add(tar, "blobs/sha256")
        for data in (config_bytes, manifest_bytes):
            _add(tar, "blobs/" + _digest(data).replace(":", "/"), data)
        for item in manifest["layers"]:
            algorithm, hexdigest = str(item["digest"]).split(":", 1)
            _add(tar, f"blobs/{algorithm}/{hexdigest}", source=layout / "blobs" / algorithm / hexdigest)
        _add(tar, "index.json", json.dumps(index, separators=(",", ":")).encode())
        _add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    partial.replace(target)
    return digest


def image_config(archive: Path) -> dict[str, Any]:
    """The configuration of the one image of an OCI archive, and its tag under the key REF_NAME."""
    with tarfile.open(archive) as tar:
        def read(name: str) -> bytes:
            member = tar.extractfile(name)
            assert member is not None, name
            return member.read()
        [entry] = json.loads(read("index.json"))["manifests"]
        manifest = json.loads(read("blobs/" + entry["digest"].replace(":", "/")))
        config: dict[str, Any] = json.loads(read("blobs/" + manifest["config"]["digest"].replace(":", "/")))
    return {**config, REF_NAME: entry["annotations"][REF_NAME]}


def sha256sums(files: list[Path]) -> str:
    """The lines of `sha256sum FILE...` run in the files' folder (hex digest, two spaces, the name), sorted by name,
    so that `sha256sum -c SHA256SUMS` checks them there."""
    lines = []
    for path in sorted(files, key=lambda p: p.name):
        digest = hashlib.sha256()
        with path.open("rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
        lines.append(f"{digest.hexdigest()}  {path.name}\n")
    return "".join(lines)

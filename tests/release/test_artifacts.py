"""The files of a release: their names, SHA256SUMS over every one of them, and the image's OCI archive with the
release's labels over the built image's own layers."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from charts.version import REPO, project_version
from common.settings import SettingsError
from kubectlplugin import krew
from release.artifacts import (
    REF_NAME,
    REVISION_LABEL,
    VERSION_LABEL,
    Artifacts,
    image_config,
    sha256sums,
    write_oci_archive,
)
from release.build import STEPS, ReleaseSettings, Step, build, from_environ, kubectl_plugin_step
from release.source import ReleaseError, Source

LAYER = b"the layer's bytes"


def _put(layout: Path, data: bytes) -> dict[str, object]:
    hexdigest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / hexdigest).write_bytes(data)
    return {"digest": f"sha256:{hexdigest}", "size": len(data)}


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """An OCI layout as e2e.projectimage caches the built image: tagged with the build's cache key."""
    root = tmp_path / "layout"
    config = {"architecture": "amd64", "os": "linux", "config": {"Labels": {"org.opencontainers.image.title": "g"}}}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           **_put(root, json.dumps(config).encode())},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **_put(root, LAYER)}]}
    entry = {"mediaType": manifest["mediaType"], **_put(root, json.dumps(manifest).encode()),
             "annotations": {REF_NAME: "c15081e685b518bd"}}
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def test_the_archive_holds_the_layers_under_the_version_with_the_labels(layout: Path, tmp_path: Path) -> None:
    archive = tmp_path / "gpushare-1.2.3.oci.tar"
    labels = {VERSION_LABEL: "1.2.3", REVISION_LABEL: "abc123"}
    digest = write_oci_archive(layout, "c15081e685b518bd", archive, "1.2.3", labels)
    config = image_config(archive)
    assert config[REF_NAME] == "1.2.3"
    assert config["config"]["Labels"] == {"org.opencontainers.image.title": "g", **labels}
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        members = {m.name: m for m in tar.getmembers()}
        layer = tar.extractfile("blobs/sha256/" + hashlib.sha256(LAYER).hexdigest())
        assert layer is not None and layer.read() == LAYER
        manifest = tar.extractfile("blobs/" + digest.replace(":", "/"))
        assert manifest is not None and hashlib.sha256(manifest.read()).hexdigest() == digest.split(":")[1]
    assert {"oci-layout", "index.json", "blobs", "blobs/sha256"} <= set(names)
    assert len(names) == 4 + 3  # the config and the manifest are new, the layer is the layout's own
    assert {(m.mtime, m.uid, m.gid) for m in members.values()} == {(0, 0, 0)}


def test_the_archive_depends_on_the_image_only(layout: Path, tmp_path: Path) -> None:
    labels = {VERSION_LABEL: "1.2.3", REVISION_LABEL: "abc123"}
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    write_oci_archive(layout, "c15081e685b518bd", first, "1.2.3", labels)
    write_oci_archive(layout, "c15081e685b518bd", second, "1.2.3", labels)
    assert first.read_bytes() == second.read_bytes()


def test_sha256sums_is_what_sha256sum_checks(tmp_path: Path) -> None:
    files = [tmp_path / "b.tgz", tmp_path / "a.oci.tar"]
    files[0].write_bytes(b"chart")
    files[1].write_bytes(b"image")
    text = sha256sums(files)
    assert text == (f"{hashlib.sha256(b'image').hexdigest()}  a.oci.tar\n"
                    f"{hashlib.sha256(b'chart').hexdigest()}  b.tgz\n")
    (tmp_path / "SHA256SUMS").write_text(text)
    done = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout == "a.oci.tar: OK\nb.tgz: OK\n", done.stdout + done.stderr


def test_the_artifacts_are_named_by_the_version(tmp_path: Path) -> None:
    artifacts = Artifacts(tmp_path, "1.2.3")
    assert [p.name for p in (artifacts.image, artifacts.chart, artifacts.sbom, artifacts.changelog, artifacts.sums)
            ] == ["gpushare-1.2.3.oci.tar", "gpushare-1.2.3.tgz", "gpushare-1.2.3.cdx.json", "CHANGELOG-1.2.3.md",
                  "SHA256SUMS"]


def test_the_steps_are_the_image_the_chart_the_sbom_and_the_kubectl_plugin() -> None:
    assert [name for name, _ in STEPS] == ["image", "chart", "sbom", "kubectl plugin"]


def _writes(*names: str) -> Step:
    def step(source: Source, artifacts: Artifacts, settings: ReleaseSettings) -> None:
        for name in names:
            (artifacts.out / name.format(v=source.version)).write_text(name)
    return step


def _fails(source: Source, artifacts: Artifacts, settings: ReleaseSettings) -> None:
    raise ReleaseError("the image could not be built")


@pytest.fixture
def source() -> Source:
    return Source(REPO, project_version(), "0" * 40, dirty=False)


def test_sha256sums_covers_every_file_the_steps_wrote(source: Source, tmp_path: Path) -> None:
    out = tmp_path / "release" / source.version
    steps = (("image", _writes("gpushare-{v}.oci.tar")),
             ("plugin", _writes("kubectl-gpushare.tar.gz", "gpushare.yaml")))
    artifacts = build(source, out, from_environ({"HOME": str(tmp_path)}), steps)
    names = [line.split("  ")[1] for line in artifacts.sums.read_text().splitlines()]
    assert names == sorted([f"CHANGELOG-{source.version}.md", f"gpushare-{source.version}.oci.tar",
                            "kubectl-gpushare.tar.gz", "gpushare.yaml"])
    assert artifacts.changelog.read_text().startswith(f"## [{source.version}]")
    assert sorted(p.name for p in out.parent.iterdir()) == [source.version]  # the staging folder is gone


def test_a_failed_step_leaves_no_release_folder(source: Source, tmp_path: Path) -> None:
    out = tmp_path / "release" / source.version
    with pytest.raises(ReleaseError, match="could not be built"):
        build(source, out, from_environ({"HOME": str(tmp_path)}), (("image", _fails),))
    assert not out.exists()


@pytest.mark.parametrize("download_url", [None, "https://downloads.invalid/gpushare/0.1.0/"])
def test_the_kubectl_plugin_step_writes_the_wheel_the_krew_archive_and_its_manifest(
    source: Source, tmp_path: Path, download_url: str | None,
) -> None:
    staged = tmp_path / f"{source.version}.partial"
    staged.mkdir()
    env = {"HOME": str(tmp_path), **({"GPUSHARE_RELEASE_DOWNLOAD_URL": download_url} if download_url else {})}
    artifacts = Artifacts(staged, source.version)
    kubectl_plugin_step(source, artifacts, from_environ(env))
    archive = artifacts.kubectl_archive
    assert sorted(p.name for p in staged.iterdir()) == sorted([
        f"kubectl_gpushare-{source.version}-py3-none-any.whl", archive.name, f"gpushare-krew-{source.version}.yaml"])
    assert artifacts.kubectl_wheel.is_file() and artifacts.krew_manifest.is_file()
    assert krew.archived_version(archive) == source.version
    document = yaml.safe_load((staged / f"gpushare-krew-{source.version}.yaml").read_text())
    (platform,) = document["spec"]["platforms"]
    assert platform["sha256"] == krew.sha256(archive)
    base = (download_url or (tmp_path / source.version).as_uri() + "/").rstrip("/")
    assert platform["uri"] == f"{base}/{archive.name}"  # the folder build() renames the staging folder to


def test_a_download_url_that_is_not_one_is_refused() -> None:
    with pytest.raises(SettingsError, match="GPUSHARE_RELEASE_DOWNLOAD_URL='downloads' is not a URL"):
        from_environ({"HOME": "/root", "GPUSHARE_RELEASE_DOWNLOAD_URL": "downloads"})

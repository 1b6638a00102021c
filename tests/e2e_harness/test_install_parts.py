"""The pieces the install tier stands on, without a cluster: the registry serving an OCI image layout, the pod
network's configuration, the image's cache key, and the relay that carries pods' connections to the API server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e import podnet, projectimage
from e2e.registry import Store
from e2e.relay import relay
from e2e.settings import from_environ
from tests.e2e_harness.conftest import serving


def _blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}"


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """An OCI image layout as `buildah push oci:DIR:TAG` writes it: one layer, a config, a manifest, an index."""
    root = tmp_path / "layout"
    layer = _blob(root, b"layer bytes")
    config = _blob(root, b'{"architecture": "amd64", "os": "linux"}')
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"digest": config, "size": 40},
                           "layers": [{"digest": layer, "size": 11}]}).encode()
    digest = _blob(root, manifest)
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"digest": digest, "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "abc123"}}]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


@pytest.fixture
def registry(tmp_path: Path, layout: Path) -> Iterator[str]:
    (tmp_path / "busybox").write_bytes(b"\x7fELF fake busybox")
    (tmp_path / "pause").write_bytes(b"\x7fELF fake pause")
    with serving(Store(tmp_path / "busybox", tmp_path / "pause", (layout,))) as url:
        yield url


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return bytes(answer.read())


def test_the_registry_serves_the_layouts_image_by_its_tag(registry: str, layout: Path) -> None:
    manifest = _get(f"{registry}/v2/{projectimage.REPOSITORY}/manifests/abc123")
    assert manifest == projectimage.manifest_of(layout, "abc123")
    assert _get(f"{registry}/v2/{projectimage.REPOSITORY}/manifests/abc123{projectimage.UPGRADE_SUFFIX}") == manifest
    for blob in [json.loads(manifest)["config"], *json.loads(manifest)["layers"]]:
        data = _get(f"{registry}/v2/{projectimage.REPOSITORY}/blobs/{blob['digest']}")
        assert "sha256:" + hashlib.sha256(data).hexdigest() == blob["digest"]


def test_a_tag_the_layout_lacks_is_named_in_the_error(layout: Path) -> None:
    with pytest.raises(projectimage.ImageError, match="no image tagged nope"):
        projectimage.manifest_of(layout, "nope")


def test_the_image_key_follows_every_context_file_and_the_base(tmp_path: Path) -> None:
    for name in projectimage.CONTEXT:
        path = tmp_path / name
        if "." in name or name == "Dockerfile":
            path.write_text(name)
        else:
            (path / "sub").mkdir(parents=True)
            (path / "sub" / "a.py").write_text("x = 1\n")
    (tmp_path / "webhook" / "sub" / "__pycache__").mkdir()
    (tmp_path / "webhook" / "sub" / "__pycache__" / "a.pyc").write_bytes(b"cache")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "outside.md").write_text("not in the context")
    key = projectimage.image_key("base1", tmp_path)
    assert projectimage.image_key("base2", tmp_path) != key
    (tmp_path / "docs" / "outside.md").write_text("changed")
    (tmp_path / "webhook" / "sub" / "__pycache__" / "a.pyc").write_bytes(b"other cache")
    assert projectimage.image_key("base1", tmp_path) == key, "files outside the build context change nothing"
    (tmp_path / "webhook" / "sub" / "a.py").write_text("x = 2\n")
    assert projectimage.image_key("base1", tmp_path) != key


def test_the_pod_network_configuration(tmp_path: Path) -> None:
    conf = json.loads(podnet.cni_config(tmp_path / "cni", tmp_path / "ipam").read_text())
    plugin = conf["plugins"][0]
    assert (plugin["type"], plugin["bridge"], plugin["ipam"]["type"]) == ("bridge", podnet.BRIDGE, "host-local")
    assert plugin["ipam"]["ranges"] == [[{"subnet": podnet.POD_CIDR, "gateway": podnet.GATEWAY}]]
    settings = from_environ({})
    proxy = yaml.safe_load(podnet.kube_proxy_config(settings, tmp_path / "kc", tmp_path / "kp.yaml").read_text())
    assert proxy["mode"] == "iptables" and proxy["clusterCIDR"] == podnet.POD_CIDR
    assert proxy["healthzBindAddress"].startswith("127.0.0.1:") and proxy["metricsBindAddress"].startswith("127.0.0.1:")
    assert proxy["iptables"]["localhostNodePorts"] is False
    endpoints, endpoint_slice = podnet.api_endpoints(settings)
    assert endpoints["metadata"]["labels"]["endpointslice.kubernetes.io/skip-mirror"] == "true"
    assert endpoint_slice["endpoints"][0]["addresses"] == [podnet.GATEWAY]
    assert endpoint_slice["metadata"]["labels"]["kubernetes.io/service-name"] == "kubernetes"


def test_the_relay_carries_a_connection_both_ways() -> None:
    async def scenario() -> bytes:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"echo:" + await reader.read(100))
            await writer.drain()
            writer.close()

        target = await asyncio.start_server(echo, "127.0.0.1", 0)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        task = asyncio.ensure_future(relay("127.0.0.1", port, target.sockets[0].getsockname()[1]))
        for _ in range(100):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.02)
        writer.write(b"hello")
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        task.cancel()
        target.close()
        return answer

    assert asyncio.run(scenario()) == b"echo:hello"

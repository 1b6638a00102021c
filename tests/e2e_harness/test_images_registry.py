"""The tier's images and registry: deterministic layers, and the OCI pull API served on 127.0.0.1."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import images
from e2e.registry import Store, linked_files
from tests.e2e_harness.conftest import serving


@pytest.fixture
def store(tmp_path: Path) -> Store:
    (tmp_path / "busybox").write_bytes(b"\x7fELF fake busybox")
    (tmp_path / "pause").write_bytes(b"\x7fELF fake pause")
    return Store(tmp_path / "busybox", tmp_path / "pause")


@pytest.fixture
def registry(store: Store) -> Iterator[str]:
    with serving(store) as url:
        yield url


def get(url: str) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_the_same_files_make_the_same_layer() -> None:
    files = {"bin/x": (b"content", 0o755)}
    assert images.layer(files).blob == images.layer(files).blob
    assert images.layer(files).diff_id != images.layer({"bin/x": (b"other", 0o755)}).diff_id


def test_a_layer_holds_its_files_and_links() -> None:
    made = images.layer({"bin/busybox": (b"bb", 0o755)}, {"bin/sh": "busybox"})
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(made.blob))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
    assert members["bin/busybox"].mode == 0o755 and members["bin"].isdir()


def test_the_registry_serves_a_pullable_image(registry: str) -> None:
    assert get(registry + "/v2/")[0] == 200
    status, body, headers = get(registry + "/v2/gpushare-e2e/busybox/manifests/latest")
    assert status == 200 and headers["Docker-Content-Digest"] == images.digest(body)
    manifest = json.loads(body)
    for blob in [manifest["config"], *manifest["layers"]]:
        status, data, _ = get(f"{registry}/v2/gpushare-e2e/busybox/blobs/{blob['digest']}")
        assert status == 200 and images.digest(data) == blob["digest"] and len(data) == blob["size"]
    by_digest = get(f"{registry}/v2/gpushare-e2e/busybox/manifests/{images.digest(body)}")
    assert by_digest[1] == body


def test_image_env_of_the_cuda_like_repository(registry: str) -> None:
    manifest = json.loads(get(registry + "/v2/gpushare-e2e/cuda-like/manifests/v1")[1])
    config = json.loads(get(f"{registry}/v2/gpushare-e2e/cuda-like/blobs/{manifest['config']['digest']}")[1])
    assert "NVIDIA_VISIBLE_DEVICES=all" in config["config"]["Env"]


def test_slow_tags_are_fresh_layers_with_their_delay(store: Store) -> None:
    first = json.loads(store.manifest("gpushare-e2e/busybox", "slow-2500-a") or b"")
    second = json.loads(store.manifest("gpushare-e2e/busybox", "slow-2500-b") or b"")
    assert first["layers"][0] == second["layers"][0], "the busybox layer is shared"
    assert first["layers"][1] != second["layers"][1], "each slow tag has a layer of its own"
    assert store.delay[first["layers"][1]["digest"]] == 2.5
    fast = json.loads(store.manifest("gpushare-e2e/busybox", "fast") or b"")
    assert fast["layers"][1]["digest"] not in store.delay


@pytest.mark.parametrize("path", ["/v2/nothing/manifests/x", "/v2/gpushare-e2e/busybox/blobs/sha256:00", "/etc"])
def test_unknown_paths_are_404(registry: str, path: str) -> None:
    assert get(registry + path)[0] == 404


def test_a_binary_image_holds_the_program_and_what_its_loader_needs(registry: str, store: Store) -> None:
    program = Path("/bin/true").resolve()  # a dynamically linked program of the machine
    store.add_binary("gpushare-e2e/one-program", "v1", program)
    status, body, _ = get(f"{registry}/v2/gpushare-e2e/one-program/manifests/v1")
    assert status == 200
    [entry] = json.loads(body)["layers"]
    _, blob, _ = get(f"{registry}/v2/gpushare-e2e/one-program/blobs/{entry['digest']}")
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
        names = set(tar.getnames())
        assert tar.getmember(f"usr/bin/{program.name}").mode == 0o755
    assert {f"usr/bin/{program.name}", "tmp/.keep"} <= names
    assert any(n.startswith("lib") and "/libc.so" in n for n in names), names
    assert any("ld-linux" in n for n in names), names


def test_a_static_program_is_imaged_alone(tmp_path: Path) -> None:
    """glibc's ldd exits 1 for an executable with no program interpreter (Go's with CGO_ENABLED=0); an ELF header
    with nothing after it is one to ldd."""
    program = tmp_path / "static-program"
    program.write_bytes(b"\x7fELF" + bytes(60))
    program.chmod(0o755)
    assert linked_files(program) == {}
    made = images.binary_image(program, linked_files(program))
    [layer] = [blob for blob in made.blobs.values() if blob[:2] == b"\x1f\x8b"]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        assert {n for n in tar.getnames() if not tar.getmember(n).isdir()} == {"usr/bin/static-program", "tmp/.keep"}


def test_ldd_failing_otherwise_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(subprocess.CalledProcessError):
        linked_files(tmp_path / "no-such-program")

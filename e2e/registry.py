"""A small OCI registry on 127.0.0.1 that serves the tier's images, with pulls as slow as a tag asks.

Repositories: `gpushare-e2e/pause` (tag `1`), `gpushare-e2e/busybox` and `gpushare-e2e/cuda-like` (busybox
whose image env sets NVIDIA_VISIBLE_DEVICES=all, as every nvidia/cuda image does). A busybox tag
`slow-<ms>-<anything>` is made on first request with a layer unique to the tag, whose download takes <ms>
milliseconds: every such tag is a fresh pull of several seconds, as in the bug report. Any other tag is
served at once. With `--oci-layout DIR`, the images of an OCI image layout too (the project's own image, built by
e2e.projectimage), as `gpushare-e2e/gpushare:<tag>` and `<tag>-upgrade` (the same image under a second tag, for
the upgrade tests), their blobs read from the layout's files. With `--binary-image NAME:TAG=PROGRAM`, an image of
that one program and the C library it links, if any (images.binary_image; the reference device plugin's DaemonSet
image, the benchmark's floor).
Read-only: GET and
HEAD of /v2/, manifests and blobs (the OCI distribution pull API).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from e2e import images
from e2e.projectimage import REPOSITORY, UPGRADE_SUFFIX, manifest_of

_SLOW = re.compile(r"slow-(\d{1,6})-[A-Za-z0-9._-]{1,64}")
_PATH = re.compile(r"/v2/(?P<name>[a-z0-9/._-]+)/(?P<kind>manifests|blobs)/(?P<ref>[A-Za-z0-9:._-]+)")


class Store:
    def __init__(self, busybox: Path, pause: Path, layouts: tuple[Path, ...] = ()) -> None:
        self.base = images.busybox_layer(busybox)
        self.pause = images.pause_image(pause)
        self.blobs: dict[str, bytes] = dict(self.pause.blobs)
        self.files: dict[str, Path] = {}  # blob digest -> its file in an OCI layout
        self.delay: dict[str, float] = {}  # blob digest -> seconds its download takes
        self.manifests: dict[tuple[str, str], bytes] = {("gpushare-e2e/pause", "1"): self.pause.manifest}
        self._lock = threading.Lock()
        for layout in layouts:
            self.add_layout(layout)

    def add_layout(self, layout: Path) -> None:
        """Every tagged image of an OCI image layout, under projectimage.REPOSITORY."""
        index = json.loads((layout / "index.json").read_text())
        for entry in index.get("manifests") or []:
            tag = (entry.get("annotations") or {}).get("org.opencontainers.image.ref.name")
            if tag:
                self.manifests[(REPOSITORY, tag)] = manifest_of(layout, tag)
                self.manifests[(REPOSITORY, tag + UPGRADE_SUFFIX)] = self.manifests[(REPOSITORY, tag)]
        for blob in (layout / "blobs" / "sha256").iterdir():
            self.files["sha256:" + blob.name] = blob

    def add_binary(self, name: str, tag: str, program: Path) -> None:
        """An image of `program` alone (and its loader's files, as `ldd` lists them), as name:tag."""
        made = images.binary_image(program, linked_files(program))
        with self._lock:
            self.blobs.update(made.blobs)
            self.manifests[(name, tag)] = made.manifest

    def blob(self, ref: str) -> bytes | None:
        if ref in self.blobs:
            return self.blobs[ref]
        path = self.files.get(ref)
        return path.read_bytes() if path is not None else None

    def manifest(self, name: str, ref: str) -> bytes | None:
        with self._lock:
            if ref.startswith("sha256:"):
                return next((m for m in self.manifests.values() if images.digest(m) == ref), None)
            if (name, ref) not in self.manifests and name in ("gpushare-e2e/busybox", "gpushare-e2e/cuda-like"):
                env = ["NVIDIA_VISIBLE_DEVICES=all"] if name.endswith("cuda-like") else []
                made = images.test_image(self.base, f"{name}:{ref}", env=env)
                self.blobs.update(made.blobs)
                slow = _SLOW.fullmatch(ref)
                if slow:
                    unique = images.tag_layer(f"{name}:{ref}")
                    self.delay[images.digest(unique.blob)] = int(slow.group(1)) / 1000
                self.manifests[(name, ref)] = made.manifest
            return self.manifests.get((name, ref))


_LDD = re.compile(r"^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$")


def linked_files(program: Path) -> dict[str, Path]:
    """The shared objects `ldd` resolves for a program, by the path the program's loader looks them up at; none for
    a static program (Go's with CGO_ENABLED=0), for which glibc's ldd exits 1 saying it is not dynamic."""
    done = subprocess.run(["ldd", str(program)], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        if "not a dynamic executable" in done.stdout + done.stderr:
            return {}
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    out: dict[str, Path] = {}
    for line in done.stdout.splitlines():
        found = _LDD.match(line)
        if found:
            out[found[1]] = Path(found[1]).resolve()
    return out


class Handler(BaseHTTPRequestHandler):
    server: Registry
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("registry: " + (format % args) + "\n")

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        if self.path in ("/v2", "/v2/"):
            self._send(200, b"{}", "application/json", body=body)
            return
        match = _PATH.fullmatch(self.path.split("?")[0])
        store = self.server.store
        if match is None:
            self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN","message":"no such path"}]}', "application/json",
                       body=body)
            return
        if match["kind"] == "manifests":
            data = store.manifest(match["name"], match["ref"])
            media = images.MANIFEST
        else:
            data = store.blob(match["ref"])
            media = "application/octet-stream"
            if data is not None and body:
                time.sleep(store.delay.get(match["ref"], 0.0))
        if data is None:
            self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}', "application/json",
                       body=body)
            return
        self._send(200, data, media, body=body, digest=images.digest(data))

    def _send(self, status: int, data: bytes, media: str, *, body: bool, digest: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if body:
            self.wfile.write(data)


class Registry(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, store: Store) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.store = store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.registry", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--busybox", type=Path, required=True)
    parser.add_argument("--pause", type=Path, required=True)
    parser.add_argument("--oci-layout", type=Path, action="append", default=[],
                        help="an OCI image layout whose tagged images to serve as gpushare-e2e/gpushare:<tag>")
    parser.add_argument("--binary-image", action="append", default=[], metavar="NAME:TAG=PROGRAM",
                        help="serve an image of one program (and the C library it links) as NAME:TAG")
    args = parser.parse_args(argv)
    store = Store(args.busybox, args.pause, tuple(args.oci_layout))
    for item in args.binary_image:
        ref, _, program = item.partition("=")
        name, _, tag = ref.rpartition(":")
        if not (name and tag and program):
            parser.error(f"--binary-image {item!r} is not NAME:TAG=PROGRAM")
        store.add_binary(name, tag, Path(program))
    server = Registry(args.port, store)
    print(f"registry serving on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

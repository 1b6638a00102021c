"""Secret and ConfigMap volumes for the tier's host processes, written the way the kubelet writes them.

The kubelet projects a Secret into a pod with its AtomicWriter (k8s.io/kubernetes pkg/volume/util/
atomic_writer.go): the payload goes into a fresh timestamped directory `..<time>`, a symlink `..data_tmp` to it
is renamed over `..data`, and each visible file is a symlink `key -> ..data/key`, so a reader sees the whole old
set or the whole new set, never a mix. `python -m e2e.volumes` keeps such a directory in step with a Secret, as
the kubelet does for a running pod, so the webhook's reload of rotated certificates is exercised as in a pod.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path

from e2e.kube import Kubectl

DATA = "..data"
DATA_TMP = "..data_tmp"


def current(directory: Path) -> dict[str, bytes]:
    """The payload the directory shows now (empty when nothing was written yet)."""
    data = directory / DATA
    if not data.is_symlink():
        return {}
    return {p.name: p.read_bytes() for p in data.resolve().iterdir() if p.is_file()}


def write(directory: Path, payload: dict[str, bytes], mode: int = 0o600) -> bool:
    """Project `payload` into `directory` atomically; returns whether anything changed."""
    directory.mkdir(parents=True, exist_ok=True)
    if current(directory) == payload:
        return False
    old = (directory / DATA).resolve() if (directory / DATA).is_symlink() else None
    stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    fresh = directory / stamp
    fresh.mkdir()
    for key, value in payload.items():
        (fresh / key).write_bytes(value)
        (fresh / key).chmod(mode)
    tmp = directory / DATA_TMP
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(stamp)
    os.replace(tmp, directory / DATA)  # the one atomic step: readers switch from the old set to the new
    for key in payload:
        visible = directory / key
        if not visible.is_symlink():
            visible.unlink(missing_ok=True)
            visible.symlink_to(Path(DATA) / key)
    for stale in directory.iterdir():
        if stale.is_symlink() and stale.name not in payload and not stale.name.startswith(".."):
            stale.unlink()
    if old is not None and old != fresh:
        shutil.rmtree(old, ignore_errors=True)
    return True


def fetch(kubectl: Kubectl, kind: str, name: str, namespace: str) -> dict[str, bytes]:
    """A Secret's (base64) or ConfigMap's keys and values."""
    obj = json.loads(kubectl.ok(["get", kind, name, "-n", namespace, "-o", "json"], timeout=15))
    data = obj.get("data") or {}
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in data.items()}
    return {k: v.encode() for k, v in data.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.volumes",
                                     description="Keep a directory in step with a Secret, as the kubelet does.")
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--period", type=float, default=2.0, help="seconds between syncs")
    args = parser.parse_args(argv)
    kubectl = Kubectl(args.kubeconfig)
    while True:
        try:
            if write(args.dir, fetch(kubectl, "secret", args.secret, args.namespace)):
                print(f"updated {args.dir} from Secret {args.namespace}/{args.secret}", flush=True)
        except Exception as exc:  # a sync that fails is retried on the next period, as the kubelet does
            print(f"sync of Secret {args.namespace}/{args.secret} failed, retrying: {exc}", file=sys.stderr,
                  flush=True)
        time.sleep(args.period)


if __name__ == "__main__":
    sys.exit(main())

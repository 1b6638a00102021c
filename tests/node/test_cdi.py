"""The CDI container edits of a GPU, and the spec files and fake GPUs' files on the node's filesystem."""

from __future__ import annotations

import os
from pathlib import Path

from node import cdiedits
from node.cdi import CdiStore, ensure_file
from node.inventory import Gpu


def test_cdi_spec_for_a_real_and_a_fake_gpu() -> None:
    real = Gpu(1, "GPU-1111", 80, minor=3)
    nodes = cdiedits.device_nodes(real, ["/dev/nvidiactl", "/dev/nvidia-uvm"])
    assert nodes == ["/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    spec = cdiedits.cdi_spec("abc", real, nodes, 4, 6)
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "gpushare.io/gpu"
    (device,) = spec["devices"]
    assert device["name"] == "abc"
    assert device["containerEdits"]["deviceNodes"] == [{"path": p} for p in nodes]
    assert device["containerEdits"]["env"] == [
        "NVIDIA_VISIBLE_DEVICES=GPU-1111", "ALIYUN_COM_GPU_MEM_IDX=1", "ALIYUN_COM_GPU_MEM_DEV=80",
        "ALIYUN_COM_GPU_MEM_CONTAINER=4", "ALIYUN_COM_GPU_MEM_POD=6",
    ]
    assert "mounts" not in device["containerEdits"]  # a real GPU: device nodes only
    fake = Gpu(0, "GPU-0000", 8)
    assert cdiedits.device_nodes(fake, ["/dev/nvidiactl"]) == []
    assert cdiedits.fake_gpu_file(fake) == ("GPU-0000.txt", "index=0\nuuid=GPU-0000\n")
    edits = cdiedits.cdi_spec("abc", fake, [], 1, 1, gpu_file="/var/run/gpushare/fake-gpus/GPU-0000.txt")
    edits = edits["devices"][0]["containerEdits"]
    assert "deviceNodes" not in edits
    assert edits["mounts"] == [{"hostPath": "/var/run/gpushare/fake-gpus/GPU-0000.txt",
                                "containerPath": "/run/gpushare/gpu", "options": ["ro", "nosuid", "nodev", "bind"]}]


def test_cdi_store_writes_atomically_lists_and_removes(tmp_path: Path) -> None:
    store = CdiStore(str(tmp_path / "cdi"))
    assert store.slots() == {}
    path = store.write("0123456789abcdef", {"kind": "gpushare.io/gpu", "n": 1})
    store.write("0123456789abcdef", {"kind": "gpushare.io/gpu", "n": 2})
    (tmp_path / "cdi" / "other-vendor.json").write_text("{}")
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert store.read("0123456789abcdef") == {"kind": "gpushare.io/gpu", "n": 2}
    assert list(store.slots()) == ["0123456789abcdef"]
    assert sorted(os.listdir(tmp_path / "cdi")) == ["gpushare-0123456789abcdef.json", "other-vendor.json"]
    store.remove("0123456789abcdef")
    store.remove("0123456789abcdef")
    assert store.slots() == {} and store.read("0123456789abcdef") is None
    assert os.listdir(tmp_path / "cdi") == ["other-vendor.json"]


def test_a_fake_gpus_file_keeps_its_inode_while_its_text_is_right(tmp_path: Path) -> None:
    """A container starting on the GPU may be bind-mounting the file: one with the right text is never replaced
    (runc would mount the unlinked inode and refuse the start); wrong text is replaced, and no temp file stays."""
    path = str(tmp_path / "fake-gpus" / "GPU-0000.txt")
    assert ensure_file(path, "index=0\n") == path
    inode = os.stat(path).st_ino
    ensure_file(path, "index=0\n")
    assert os.stat(path).st_ino == inode and os.stat(path).st_mode & 0o777 == 0o644
    ensure_file(path, "index=1\n")
    assert Path(path).read_text() == "index=1\n" and os.stat(path).st_ino != inode
    assert os.listdir(tmp_path / "fake-gpus") == ["GPU-0000.txt"]

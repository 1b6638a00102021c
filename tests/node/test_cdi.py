"""The CDI container edits of a GPU, and the spec files and fake GPUs' files on the node's filesystem."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node import cdiedits
from node.cdi import CdiStore, CdiWriteError, ensure_file
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


def test_a_slots_edits_are_decided_first_and_written_in_one_call(tmp_path: Path) -> None:
    """The spec lists a real GPU's control devices only where the node has them; a fake GPU's host file is written
    before the spec that mounts it; a failed write names the directory and which file it was."""
    real = Gpu(1, "GPU-1111", 80, minor=3)
    assert cdiedits.slot_edits("0123456789abcdef", real, 2, 4, "/fake").optional_nodes == cdiedits.CONTROL_DEVICES
    present, absent = tmp_path / "nvidiactl", tmp_path / "nvidia-uvm"
    present.write_text("")
    spec = cdiedits.cdi_spec("0123456789abcdef", real, ["/dev/nvidia3", str(present), str(absent)], 2, 4)
    store = CdiStore(str(tmp_path / "cdi"))
    store.write_edits(cdiedits.SlotEdits("0123456789abcdef", spec, (str(present), str(absent))))
    written = store.read("0123456789abcdef")
    assert written is not None
    assert written["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia3"}, {"path": str(present)}]
    fake = cdiedits.slot_edits("fedcba9876543210", Gpu(0, "GPU-0000", 8), 1, 1, str(tmp_path / "fake"))
    assert fake.host_file == (str(tmp_path / "fake" / "GPU-0000.txt"), "index=0\nuuid=GPU-0000\n")
    store.write_edits(fake)
    mount = store.read("fedcba9876543210")["devices"][0]["containerEdits"]["mounts"][0]  # type: ignore[index]
    assert Path(mount["hostPath"]).read_text() == "index=0\nuuid=GPU-0000\n"
    (tmp_path / "blocked").write_text("a file, not a directory")
    for edits, host_file in ((fake, False), (cdiedits.slot_edits("fedcba9876543210", Gpu(0, "GPU-0000", 8), 1, 1,
                                                                 str(tmp_path / "blocked")), True)):
        with pytest.raises(CdiWriteError) as raised:
            CdiStore(str(tmp_path / "blocked" / "cdi") if not host_file else str(tmp_path / "cdi")).write_edits(edits)
        assert raised.value.host_file is host_file and isinstance(raised.value.cause, OSError)

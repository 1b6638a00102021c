"""The kubelet's device checkpoint read as data: each container's IDs and the GPU its stored Allocate answer names,
in the layout the kubelet writes; and the adapter, which parses the file again only when the kubelet replaced it."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from contract import DEFAULT_RESOURCE
from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.checkpoint import Entry, checkpoint_entries, visible_gpu
from deviceplugin.devices import UnitInventory
from deviceplugin.kubelet import KubeletHoldings, KubeletUnavailable
from tests.harness.kubelet.devices import Entry as Kept
from tests.harness.kubelet.devices import checkpoint_document, reference_answer


def text_of(*entries: Kept) -> str:
    return json.dumps(checkpoint_document(entries, {DEFAULT_RESOURCE: []}))


def kept(uid: str, container: str, ids: tuple[str, ...], answer: dp.ContainerAllocateResponse | None,
         resource: str = DEFAULT_RESOURCE) -> Kept:
    return Kept(uid, "", "", container, resource, ids, (answer or dp.ContainerAllocateResponse()).SerializeToString())


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("0", 0),
        ("1", 1),
        ("2", None),  # an index this node does not have
        ("GPU-1", 1),  # a UUID (the reference plugin's earlier releases, and its one-GPU branch)
        ("GPU-foreign", None),  # another node's GPU
        ("no-gpu-has-8GiB-to-run", None),  # the reference plugin found no pod
        ("0,1", None),
        ("GPU-0,GPU-1", None),
        ("all", None),
        ("void", None),
        ("none", None),
        ("", None),
        ("01", None),
        (" 1", None),
        ("-1", None),
        ("+1", None),
        ("٣", None),  # a digit, but not an ASCII one
        ("9" * 5000, None),
    ],
)
def test_the_gpu_a_visible_devices_value_names(inventory: UnitInventory, visible: str, expected: int | None) -> None:
    gpus = {g.index: g for g in inventory.gpus}
    visible = visible.replace("GPU-0", gpus[0].uuid).replace("GPU-1", gpus[1].uuid)
    gpu = visible_gpu(visible, gpus)
    assert (gpu.index if gpu is not None else None) == expected


def test_each_entry_keeps_the_gpu_its_stored_answer_names() -> None:
    ours = dp.ContainerAllocateResponse(envs={"GPUSHARE_SLOT": "0123456789abcdef"})
    text = text_of(
        kept("u1", "main", ("a", "b"), reference_answer("1", 2)),
        kept("u1", "init", ("a", "b", "c"), reference_answer("no-gpu-has-3GiB-to-run", 3)),
        kept("u2", "main", ("d",), ours),
        kept("u3", "main", ("e",), None),  # an answer with nothing in it
        kept("u4", "cuda", ("f",), reference_answer("0", 1), resource="nvidia.com/gpu"),
    )
    assert checkpoint_entries(text, DEFAULT_RESOURCE) == [
        Entry("u1", "main", ("a", "b"), "1"),
        Entry("u1", "init", ("a", "b", "c"), "no-gpu-has-3GiB-to-run"),
        Entry("u2", "main", ("d",), None),
        Entry("u3", "main", ("e",), None),
    ]


@pytest.mark.parametrize("alloc_resp", [None, "", "e30=", "not base64!", 7, ["x"],
                                        base64.b64encode(b"\xff\xff\xff").decode()])
def test_an_answer_that_cannot_be_read_names_no_gpu(alloc_resp: object) -> None:
    doc = {"Data": {"PodDeviceEntries": [{"PodUID": "u1", "ContainerName": "main", "ResourceName": DEFAULT_RESOURCE,
                                          "DeviceIDs": {"0": ["a"], "1": ["b"]}, "AllocResp": alloc_resp}]}}
    assert checkpoint_entries(json.dumps(doc), DEFAULT_RESOURCE) == [Entry("u1", "main", ("a", "b"), None)]


def test_the_adapter_parses_the_file_again_only_when_the_kubelet_replaced_it(tmp_path: Path) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    reader = KubeletHoldings(str(tmp_path / "pr.sock"), str(path), DEFAULT_RESOURCE, 1.0)

    def write(text: str) -> None:  # as the kubelet writes it: a temporary file renamed over the checkpoint
        (tmp_path / "tmp").write_text(text)
        os.replace(tmp_path / "tmp", path)

    missing = reader.checkpoint()
    assert missing.entries == () and "kubelet_internal_checkpoint cannot be read" in missing.problem
    with pytest.raises(KubeletUnavailable, match="cannot be read"):
        reader.from_checkpoint()
    write(text_of(kept("u1", "main", ("a",), reference_answer("0", 1))))
    first = reader.checkpoint()
    assert first.entries == (Entry("u1", "main", ("a",), "0"),) and not first.problem
    assert reader.checkpoint() is first  # the same file: not parsed again
    write(text_of(kept("u1", "main", ("a",), reference_answer("0", 1)), kept("u2", "main", ("b",), None)))
    assert [e.pod_uid for e in reader.checkpoint().entries] == ["u1", "u2"]
    write("{")
    assert "not the device manager's JSON" in reader.checkpoint().problem

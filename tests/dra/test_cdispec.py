from __future__ import annotations

from contract.keys import ENV_CONTAINER, ENV_DEV, ENV_IDX, ENV_POD, ENV_VISIBLE
from dra.cdispec import PreparedDevice, claim_cdi_spec, claim_slot, prepared_devices
from dra.claims import Share
from node.cdiedits import FAKE_GPU_MOUNT
from tests.harness.dra.claims import GPUS, NODE, UID

SHARES = [Share("a", NODE, "gpu-0", 0, 4, "s-a"), Share("b", NODE, "gpu-1", 1, 2, "s-b")]


def test_one_cdi_device_per_result_with_the_device_plugins_edits() -> None:
    spec = claim_cdi_spec(UID, SHARES, GPUS, ["/dev/nvidiactl"], {1: "/run/fake/GPU-1111bbbb.txt"})
    assert spec == {
        "cdiVersion": "0.6.0",
        "kind": "gpushare.io/gpu",
        "devices": [
            {
                "name": f"dra-{UID}-0",
                "containerEdits": {
                    "env": [f"{ENV_VISIBLE}=GPU-0000aaaa", f"{ENV_IDX}=0", f"{ENV_DEV}=16", f"{ENV_CONTAINER}=4",
                            f"{ENV_POD}=6"],
                    "deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidiactl"}],
                },
            },
            {
                "name": f"dra-{UID}-1",
                "containerEdits": {
                    "env": [f"{ENV_VISIBLE}=GPU-1111bbbb", f"{ENV_IDX}=1", f"{ENV_DEV}=16", f"{ENV_CONTAINER}=2",
                            f"{ENV_POD}=6"],
                    "mounts": [{"hostPath": "/run/fake/GPU-1111bbbb.txt", "containerPath": FAKE_GPU_MOUNT,
                                "options": ["ro", "nosuid", "nodev", "bind"]}],
                },
            },
        ],
    }


def test_the_kubelet_gets_each_result_with_its_cdi_id() -> None:
    assert prepared_devices(UID, SHARES) == [
        PreparedDevice("a", NODE, "gpu-0", (f"gpushare.io/gpu=dra-{UID}-0",)),
        PreparedDevice("b", NODE, "gpu-1", (f"gpushare.io/gpu=dra-{UID}-1",)),
    ]


def test_cdi_names_are_unique_per_claim() -> None:
    other = "ffffffff-0000-0000-0000-000000000000"
    assert prepared_devices(UID, SHARES[:1])[0].cdi_ids != prepared_devices(other, SHARES[:1])[0].cdi_ids
    assert claim_slot(UID) == f"dra-{UID}"

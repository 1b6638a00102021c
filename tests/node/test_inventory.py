"""Table tests for the node's fake GPU inventory."""

from __future__ import annotations

import pytest

from node.inventory import InventoryError, fake_gpus


@pytest.mark.parametrize(
    ("spec", "unit", "count", "memory"),
    [
        ("2x24GiB", "GiB", 2, 24),
        ("4x64GiB", "GiB", 4, 64),
        ("1x16384MiB", "GiB", 1, 16),
        ("1x24GiB", "MiB", 1, 24576),
        ("3x1500MiB", "MiB", 3, 1500),
    ],
)
def test_fake_gpus(spec: str, unit: str, count: int, memory: int) -> None:
    gpus = fake_gpus(spec, "node-a", unit)
    assert [g.index for g in gpus] == list(range(count))
    assert {g.memory_units for g in gpus} == {memory}
    assert gpus == fake_gpus(spec, "node-a", unit)  # deterministic for the node
    assert gpus[0].uuid != fake_gpus(spec, "node-b", unit)[0].uuid


@pytest.mark.parametrize("spec", ["2x", "x24GiB", "2x24GB", "0x24GiB", "2x24", "two", "2x512MiB"])
def test_bad_fake_spec(spec: str) -> None:
    with pytest.raises(InventoryError, match="GPUSHARE_FAKE_GPUS"):
        fake_gpus(spec, "node-a", "GiB")

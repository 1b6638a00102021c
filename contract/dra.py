"""What the DRA driver's devices are called and what they offer: the names the scheduler writes into a claim's
allocation, and the results of ours in an allocated claim, read alike by the driver, by `kubectl gpushare` and by the
tests (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from contract.keys import DRA_DRIVER

# One device per GPU, named by its index: gpu-0, gpu-1, ...
DEVICE_PREFIX: Final = "gpu-"
# The capacity claims request (`capacity.requests.memory`) and results consume (`consumedCapacity.memory`).
MEMORY: Final = "memory"


def device_name(index: int) -> str:
    return f"{DEVICE_PREFIX}{index}"


def gpu_index(name: str) -> int | None:
    """The GPU index a device name of ours stands for (None: not one of our names)."""
    number = name.removeprefix(DEVICE_PREFIX)
    if name == number or not number.isdigit() or str(int(number)) != number:
        return None
    return int(number)


def driver_results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The allocation results of our driver in a ResourceClaim, in the claim's order (none while unallocated)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [r for r in results if isinstance(r, Mapping) and r.get("driver") == DRA_DRIVER]


def consumed_memory(result: Mapping[str, Any]) -> object:
    """What an allocation result consumes of a device's memory, as the API server wrote it (None: nothing)."""
    return (result.get("consumedCapacity") or {}).get(MEMORY)

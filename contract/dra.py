"""What the DRA driver's devices are called and what they offer: the names the scheduler writes into a claim's
allocation, read alike by the driver and by `kubectl gpushare` (pure)."""

from __future__ import annotations

from typing import Final

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

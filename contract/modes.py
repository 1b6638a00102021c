"""The units a GPU's memory is counted in, the delivery modes and who places a pod."""

from __future__ import annotations

from typing import Final

UNITS: Final = ("GiB", "MiB")
DELIVERY_MODES: Final = ("env", "cdi")
# Who picks a pod's GPU: the gpushare scheduler extender before binding, or the device plugin on the node (cdi only).
PLACEMENTS: Final = ("extender", "node")

"""The units a GPU's memory is counted in, the delivery modes and who places a pod, as types the checker holds every
comparison to (a misspelt mode is a type error), and their parsers for what arrives as text."""

from __future__ import annotations

from typing import Final, Literal, TypeVar, get_args

from contract.errors import ProtocolError

Unit = Literal["GiB", "MiB"]
# How a container gets its GPU: the webhook's downward-API env, or a CDI device the plugin writes.
Delivery = Literal["env", "cdi"]
# Who picks a pod's GPU: the gpushare scheduler extender before binding, or the device plugin on the node (cdi only).
Placement = Literal["extender", "node"]

UNITS: Final[tuple[Unit, ...]] = get_args(Unit)
DELIVERY_MODES: Final[tuple[Delivery, ...]] = get_args(Delivery)
PLACEMENTS: Final[tuple[Placement, ...]] = get_args(Placement)

_T = TypeVar("_T", bound=str)


def _one_of(text: object, choices: tuple[_T, ...], what: str, verdict: str = "is unknown") -> _T:
    for choice in choices:
        if text == choice:
            return choice
    raise ProtocolError(f"{what} {text!r} {verdict}; use one of {', '.join(choices)}")


def unit_of(text: object) -> Unit:
    return _one_of(text, UNITS, "unit", "is not supported")


def delivery_of(text: object) -> Delivery:
    return _one_of(text, DELIVERY_MODES, "delivery mode")


def placement_of(text: object) -> Placement:
    return _one_of(text, PLACEMENTS, "placement")

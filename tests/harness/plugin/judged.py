"""PreStartContainer's evidence and judgement of one pod, in the order deviceplugin/service.py takes them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deviceplugin.evidence import LegacyAccepted, believe
from deviceplugin.judge import Verdict, validate
from deviceplugin.trust import Context


def judged(pod: Mapping[str, Any], containers: Sequence[str], device_ids: Sequence[str], ctx: Context,
           others: Sequence[Mapping[str, Any]] = ()) -> Verdict:
    """The verdict on starting `containers` of `pod` with `device_ids`, the room judged over `others`."""
    belief = believe(pod, containers, device_ids, ctx)
    if isinstance(belief, LegacyAccepted):
        return belief
    return validate(belief, pod, containers, device_ids, ctx, others=others)

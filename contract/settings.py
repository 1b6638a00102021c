"""The cluster-wide contract both sides must agree on, and how every program reads it from GPUSHARE_* variables."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from common.cli import Variable
from common.settings import SettingsError, env_value
from contract.errors import ProtocolError
from contract.keys import COMPAT_KEYS, DEFAULT_PREFIX, DEFAULT_RESOURCE
from contract.modes import Delivery, Placement, Unit, delivery_of, placement_of, unit_of

# Matched whole (fullmatch: "$" would accept a trailing newline).
_PREFIX_RE = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/")

# What --help lists; tests check that each default here is the one every program's settings_from applies.
CONTRACT_VARIABLES = (
    Variable("GPUSHARE_RESOURCE_NAME", DEFAULT_RESOURCE, "the shared extended resource"),
    Variable("GPUSHARE_UNIT", "GiB", "what one unit of it means: GiB or MiB"),
    Variable("GPUSHARE_ANNOTATION_PREFIX", DEFAULT_PREFIX, "prefix of the gpushare annotations"),
    Variable("GPUSHARE_DELIVERY", "env", "env or cdi; the same on the webhook and every plugin"),
    Variable("GPUSHARE_PLACEMENT", "extender", "extender, or node (cdi only): the plugin picks the GPU, best fit; "
             "the same on the webhook and every plugin"),
)

@dataclass(frozen=True)
class Contract:
    """The cluster-wide settings both sides must agree on."""

    resource: str = DEFAULT_RESOURCE
    unit: Unit = "GiB"
    prefix: str = DEFAULT_PREFIX
    delivery: Delivery = "env"
    placement: Placement = "extender"

    def __post_init__(self) -> None:
        # The types hold what the checker sees; these hold what arrives untyped (a ConfigMap, a test's JSON).
        unit_of(self.unit)
        delivery_of(self.delivery)
        placement_of(self.placement)
        if self.placement == "node" and self.delivery != "cdi":
            raise ProtocolError(
                "node placement needs cdi delivery: in env delivery the GPU index must be in the pod's annotations "
                "before the kubelet admits it, so only the scheduler extender can place pods; set "
                "GPUSHARE_DELIVERY=cdi or GPUSHARE_PLACEMENT=extender in the shared settings (the gpushare-config "
                "ConfigMap), so the webhook and every plugin agree"
            )
        if not _PREFIX_RE.fullmatch(self.prefix) or len(self.prefix) > 254:
            raise ProtocolError(
                f"annotation prefix {self.prefix!r} is not a DNS subdomain followed by '/', e.g. gpushare.io/"
            )
        if "/" not in self.resource:
            raise ProtocolError(f"resource name {self.resource!r} must be a domain-prefixed extended resource")

    @property
    def intent_key(self) -> str:
        return self.prefix + "intent"

    @property
    def signature_key(self) -> str:
        return self.prefix + "intent-signature"

    @property
    def allocation_key(self) -> str:
        return self.prefix + "allocation"

    @property
    def own_keys(self) -> tuple[str, str, str]:
        return (self.intent_key, self.signature_key, self.allocation_key)

    @property
    def reserved_keys(self) -> tuple[str, ...]:
        return (*COMPAT_KEYS, *self.own_keys)


def contract_from(env: Mapping[str, str]) -> Contract:
    """The cluster-wide contract, read the same way by the webhook and the device plugin."""
    resource = env_value(env, "GPUSHARE_RESOURCE_NAME", DEFAULT_RESOURCE)
    prefix = env_value(env, "GPUSHARE_ANNOTATION_PREFIX", DEFAULT_PREFIX)
    try:
        return Contract(resource=resource, unit=unit_of(env_value(env, "GPUSHARE_UNIT", "GiB")), prefix=prefix,
                        delivery=delivery_of(env_value(env, "GPUSHARE_DELIVERY", "env")),
                        placement=placement_of(env_value(env, "GPUSHARE_PLACEMENT", "extender")))
    except ProtocolError as exc:
        raise SettingsError(
            f"the GPUSHARE_RESOURCE_NAME / GPUSHARE_UNIT / GPUSHARE_ANNOTATION_PREFIX / GPUSHARE_DELIVERY / "
            f"GPUSHARE_PLACEMENT settings are inconsistent: {exc}"
        ) from exc

"""The reserved names in the admission policies' CEL are the contract's (contract/keys.py), not a second definition:
every key, prefix and resource name a CEL expression spells is one the contract defines, and every list of keys
there is one of the contract's own groups."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from contract import ASSIGNED, ASSUME_TIME, COMPAT_PREFIX, DEFAULT_PREFIX, DEFAULT_RESOURCE, PLACEMENT_KEYS, Contract
from contract.keys import COMPAT_KEYS, GPU_COUNT
from tests.harness.manifests.render import MANIFESTS
from tests.manifests.test_policy import documents
from webhook.server.settings import settings_from

CONTRACT = Contract()
# The whole-GPU resources of other device plugins: a setting of the webhook whose default the policy spells.
OTHER_RESOURCES = settings_from({}).other_gpu_resources
DEFINED = {COMPAT_PREFIX, DEFAULT_PREFIX, DEFAULT_RESOURCE, GPU_COUNT, *COMPAT_KEYS, *CONTRACT.own_keys,
           *OTHER_RESOURCES}
# What a key group in the CEL may be: the plugin's own keys, the placement a node-local plugin may add, the intent.
GROUPS = {
    (ASSIGNED, CONTRACT.allocation_key),
    (*PLACEMENT_KEYS, ASSUME_TIME),
    (CONTRACT.intent_key, CONTRACT.signature_key),
}
_NAME = re.compile(r"ALIYUN_COM_GPU_MEM_[A-Z_]*|gpushare\.io/[a-z-]*|[a-z0-9.-]+\.com/[a-z-]+")
_LITERAL = re.compile(r"'([^']*)'|\"([^\"]*)\"")
# A list literal of strings; not an index (`limits['aliyun.com/gpu-mem']`, `annotations['ALIYUN_COM_GPU_MEM_IDX']`).
_LIST = re.compile(r"(?<![\w\])])\[\s*('[^'\]]*'(?:\s*,\s*'[^'\]]*')*)\s*\]")


def _expressions(doc: Any) -> Iterator[str]:
    """The CEL of a policy: its expressions, not its messages (prose may name the keys freely)."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "expression" and isinstance(value, str):
                yield value
            else:
                yield from _expressions(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _expressions(item)


def _cel() -> list[str]:
    """The CEL of the base's ValidatingAdmissionPolicies and of the in-process MutatingAdmissionPolicy."""
    in_process = yaml.safe_load_all((MANIFESTS / "in-process" / "neutralise-policy.yaml").read_text())
    return [e for d in [*documents(), *in_process] if d and d["kind"].endswith("AdmissionPolicy")
            for e in _expressions(d)]


def test_the_policies_spell_reserved_names() -> None:
    """The checks below would pass on a policy that names nothing: it names the keys it guards."""
    names = {n for e in _cel() for m in _LITERAL.finditer(e) for n in _NAME.findall(m.group(1) or m.group(2) or "")}
    assert {COMPAT_PREFIX, DEFAULT_PREFIX, DEFAULT_RESOURCE, ASSIGNED, CONTRACT.intent_key} <= names, names


@pytest.mark.parametrize("expression", _cel())
def test_every_reserved_name_in_the_cel_is_the_contracts(expression: str) -> None:
    for match in _LITERAL.finditer(expression):
        for name in _NAME.findall(match.group(1) or match.group(2) or ""):
            assert name in DEFINED, f"{name!r} in the CEL is not a name contract/keys.py defines: {expression}"


@pytest.mark.parametrize("expression", [e for e in _cel() if _LIST.search(e)])
def test_every_key_list_in_the_cel_is_a_group_of_the_contract(expression: str) -> None:
    for match in _LIST.finditer(expression):
        items = tuple(re.findall(r"'([^']*)'", match.group(1)))
        if any(_NAME.fullmatch(i) for i in items):
            assert items in GROUPS, f"key list {items} in the CEL is none of the contract's groups {GROUPS}"

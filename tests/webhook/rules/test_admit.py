"""One call for a GPU-share pod's CREATE: the mutating entry answers what mutate and validate answered together."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
import yaml
from celpy.adapter import json_to_cel

from tests.harness.apiserver import policies
from tests.harness.manifests.render import MANIFESTS
from tests.harness.pods import KEY, NS, USER, Pod, annotate, container, counter, pod
from tests.webhook.rules.test_validate import CREATE_ALLOWED, CREATE_DENIALS, POLICY, UNBOOKABLE, with_env
from webhook.rules.admit import is_gpu_share, mutate_create, patched
from webhook.rules.mutate import NoSigningKey, mutate
from webhook.rules.validate import validate
from webhook.server.settings import Settings

ORDINARY = [
    ("plain", pod(container("web")), POLICY),
    ("CUDA image env", with_env(pod(container("cuda")), [{"name": "CUDA_VERSION", "value": "12.4"}]), POLICY),
    ("whole GPU", pod({"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}), POLICY),
    ("a team annotation", annotate(pod(container("web")), {"team": "vision"}), POLICY),
]
ROWS = [*((c, p, s) for c, p, s, _ in CREATE_DENIALS), *CREATE_ALLOWED, *((c, p, POLICY) for c, p, _ in UNBOOKABLE),
        ("limit 0", pod(container("a", 0)), POLICY), ("annotation only", annotate(pod(container("a")), {
            "gpushare.io/anything": "x"}), POLICY), *ORDINARY]


def two_calls(p: Pod, settings: Settings) -> tuple[list[dict[str, Any]], tuple[bool, str, tuple[str, ...]]]:
    """What the API server had from mutate.gpushare.io and then validate.gpushare.io."""
    patch = mutate(p, NS, settings.contract, KEY, counter(), other_gpu=settings.other_gpu_resources)
    made = jsonpatch.apply_patch(copy.deepcopy(p), patch)
    verdict = validate("CREATE", None, made, USER, NS, settings, KEY.public_key())
    return patch, (verdict.allowed, verdict.message, verdict.reasons)


@pytest.mark.parametrize(("case", "sent", "settings"), ROWS, ids=[r[0] for r in ROWS])
def test_one_call_answers_what_the_two_calls_answered(case: str, sent: Pod, settings: Settings) -> None:
    patch, verdict = mutate_create(copy.deepcopy(sent), NS, settings, KEY, KEY.public_key(), counter())
    old_patch, old_verdict = two_calls(sent, settings)
    assert patch == old_patch, case
    if verdict is None:  # an ordinary pod: its own entries judge it, as before
        assert not is_gpu_share(sent, settings), case
        return
    assert (verdict.allowed, verdict.message, verdict.reasons) == old_verdict, case


@pytest.mark.parametrize(("case", "sent", "settings"), ROWS, ids=[r[0] for r in ROWS])
def test_the_patched_pod_is_the_pod_jsonpatch_makes(case: str, sent: Pod, settings: Settings) -> None:
    patch = mutate(sent, NS, settings.contract, KEY, counter(), other_gpu=settings.other_gpu_resources)
    before = copy.deepcopy(sent)
    assert patched(sent, patch) == jsonpatch.apply_patch(copy.deepcopy(sent), patch), case
    assert sent == before, "the pod sent is left as it was"


def test_patched_refuses_an_operation_mutate_never_makes() -> None:
    with pytest.raises(ValueError, match="an operation it never makes: 'remove'"):
        patched(pod(container("a")), [{"op": "remove", "path": "/spec"}])


def _conditions() -> dict[str, str]:
    """The condition gpushare-pods-only of mutate.gpushare.io and of the policy gpushare-gpu-share-pods."""
    hooks = [d for d in yaml.safe_load_all((MANIFESTS / "base" / "admission.yaml").read_text()) if d]
    [entry] = [h for d in hooks for h in d["webhooks"] if h["name"] == "mutate.gpushare.io"]
    docs = [d for d in yaml.safe_load_all((MANIFESTS / "base" / "policy.yaml").read_text()) if d]
    [gpu_policy] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"
                    and d["metadata"]["name"] == "gpushare-gpu-share-pods"]
    return {"webhook": entry["matchConditions"][0]["expression"],
            "policy": gpu_policy["spec"]["matchConditions"][0]["expression"]}


@pytest.mark.parametrize(("case", "sent", "settings"), ROWS, ids=[r[0] for r in ROWS])
def test_gpu_share_pods_are_those_the_entry_selects(case: str, sent: Pod, settings: Settings) -> None:
    activation = {"object": json_to_cel(sent), "oldObject": None,
                  "request": json_to_cel({"operation": "CREATE", "namespace": NS})}
    for where, expression in _conditions().items():
        assert bool(policies.run(expression, activation)) is is_gpu_share(sent, settings), (case, where)


def test_the_policy_selects_what_the_entry_selects_at_a_create() -> None:
    """The entry's condition is the policy's and a clause about UPDATEs, which a CREATE never meets."""
    conditions = {k: " ".join(v.split()) for k, v in _conditions().items()}
    assert conditions["webhook"].startswith(conditions["policy"] + " || (request.operation == 'UPDATE' && ")


def test_without_the_key_a_gpu_share_pod_with_an_intent_is_not_judged() -> None:
    """An intent to verify needs the key; the view answers that the key cannot be read (webhook/server/app.py)."""
    sent = annotate(pod(container("a", 0)), {"gpushare.io/intent": "{}", "gpushare.io/intent-signature": "x"})
    with pytest.raises(NoSigningKey):
        mutate_create(sent, NS, POLICY, None, KEY.public_key(), counter())
    # A limit of 0 and no stamp: nothing to sign or verify, judged without the key.
    _, verdict = mutate_create(pod(container("a", 0)), NS, POLICY, None, KEY.public_key(), counter())
    assert verdict is not None and verdict.allowed

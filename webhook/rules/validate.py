"""(operation, old pod, new pod, user) -> verdict: the lifecycle rules of the annotation contract (pure).

The rules themselves are in webhook/rules/create_rules.py and webhook/rules/update_rules.py; this module turns their
problems into the one denial message the API server returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from contract import pod_ref
from webhook.rules.binding import binding_problems
from webhook.rules.create_rules import create_problems
from webhook.rules.problems import REASONS, Pod, Policy, Problem, tagged
from webhook.rules.update_rules import update_problems


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    reasons: tuple[str, ...] = ()  # of a denial, each once, in REASONS order


ALLOWED = Verdict(True)


def validate(  # noqa: PLR0917 - the call shape of the shared contract: (operation, old, new, user, ns, ...)
    operation: str, old: Pod | None, new: Pod, username: str, namespace: str, policy: Policy,
    public_key: Ed25519PublicKey, *, token_node: str | None = None, subresource: str = "",
) -> Verdict:
    """Allow, or deny with whole sentences that name the pod, each offending key and the fix.

    `token_node`: the node the caller's token is bound to (userInfo.extra), None where it names none.
    """
    if operation == "CREATE":
        return create_verdict(new, namespace, policy, public_key)
    if operation == "UPDATE" and old is not None:
        return _verdict(update_problems(old, new, username, policy, token_node, subresource), pod_ref(new, namespace))
    return ALLOWED


def create_verdict(pod: Pod, namespace: str, policy: Policy, public_key: Ed25519PublicKey, *,
                   genuine: bool = False) -> Verdict:
    """The CREATE rules alone, as the mutating entry judges a GPU-share pod it has just stamped (webhook/rules/admit.py;
    `genuine`: the pod's intent is the webhook's own, its signature not checked again)."""
    return _verdict(create_problems(pod, namespace, policy, public_key, genuine=genuine), pod_ref(pod, namespace))


def validate_binding(binding: Pod, username: str, namespace: str, policy: Policy) -> Verdict:
    """A pods/binding CREATE: allow, or deny naming each reserved annotation the Binding may not carry."""
    problems = tagged("not_authorized", binding_problems(binding, username, policy.extender_identities,
                                                          policy.contract))
    return _verdict(problems, pod_ref(binding, namespace))


def _verdict(problems: list[Problem], pod: str) -> Verdict:
    if not problems:
        return ALLOWED
    sentences = " ".join(_sentence(p.text) for p in problems)
    found = {p.reason for p in problems}
    reasons = tuple(r for r in REASONS if r in found)
    return Verdict(False, f"gpushare denied pod {pod}. {sentences}", reasons)


def _sentence(problem: str) -> str:
    text = problem[0].upper() + problem[1:]
    return text if text.endswith(".") else text + "."

"""docs/troubleshooting.md explains every refusal the code can give: each reason the webhook counts a denial under,
each ValidatingAdmissionPolicy of the manifests, each reason the device plugin refuses under, and each message of
the DRA driver. The lists come from the code, so a new refusal without its entry fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from deviceplugin.metrics import REASONS as PLUGIN_REASONS
from kubectlplugin.events import ALLOCATED_REASON
from webhook.rules.problems import REASONS as WEBHOOK_REASONS

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "troubleshooting.md").read_text()
# The section "## Refusals", up to the next section (other sections, such as alerts, may follow it).
REFUSALS = DOC[DOC.index("\n## Refusals\n"):].split("\n## ")[1]
HEADINGS = [line[4:] for line in REFUSALS.splitlines() if line.startswith("### ")]


def _literals(folder: str, pattern: str) -> set[str]:
    """Every string constant of the Python files under `folder` that matches `pattern` whole."""
    found: set[str] = set()
    for path in (REPO / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(pattern, node.value):
                found.add(node.value)
    return found


def _denial_reasons() -> set[str]:
    """The reasons the admission rules tag problems with: REASONS, and the literal of every tagged(...)/Problem(...)."""
    found = set(WEBHOOK_REASONS)
    for path in (REPO / "webhook" / "rules").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("tagged", "Problem"):
                reason = node.args[0] if getattr(node.func, "id", "") == "tagged" else node.args[-1]
                if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                    found.add(reason.value)
    return found


def _plugin_reasons() -> set[str]:
    return (set(PLUGIN_REASONS) | _literals("deviceplugin", r"GpuShare[A-Z]\w+")) - {ALLOCATED_REASON}


def _policies() -> set[str]:
    return {doc["metadata"]["name"] for path in (REPO / "manifests").rglob("*.yaml")
            for doc in yaml.safe_load_all(path.read_text())
            if isinstance(doc, dict) and doc.get("kind") == "ValidatingAdmissionPolicy"}


def _fragments(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        out = [""]
        for value in node.values:
            if isinstance(value, ast.Constant):
                out[-1] += str(value.value)
            else:
                out.append("")
        return out
    return []


def _dra_messages() -> list[tuple[str, str]]:
    """(where, the longest fixed part) of every message the DRA driver answers a claim with: its ClaimErrors, and
    the servicer's own answers for a claim it could not work on."""
    out = []
    for path in sorted((REPO / "dra").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            message: ast.expr | None = None
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ClaimError" and node.args:
                message = node.args[0]
            elif isinstance(node, ast.JoinedStr) and _fragments(node)[0].startswith("the gpushare DRA driver"):
                message = node
            if message is not None:
                parts = _fragments(message)
                assert parts, f"{path.name}:{message.lineno}: a message that is not a string"
                out.append((f"{path.name}:{message.lineno}", max((p.strip() for p in parts), key=len)))
    return out


def _words(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def _headed(name: str) -> bool:
    return any(f"`{name}`" in heading or f"'{name}'" in heading for heading in HEADINGS)


@pytest.mark.parametrize("reason", sorted(_denial_reasons()))
def test_every_denial_reason_has_an_entry(reason: str) -> None:
    assert _headed(reason), f"docs/troubleshooting.md has no ### entry for the denial reason {reason}"


@pytest.mark.parametrize("policy", sorted(_policies()))
def test_every_admission_policy_has_an_entry(policy: str) -> None:
    assert _headed(policy), f"docs/troubleshooting.md has no ### entry for ValidatingAdmissionPolicy {policy}"


@pytest.mark.parametrize("reason", sorted(_plugin_reasons()))
def test_every_device_plugin_refusal_has_an_entry(reason: str) -> None:
    assert _headed(reason), f"docs/troubleshooting.md has no ### entry for the device plugin's {reason}"


def test_the_dra_driver_messages_are_found() -> None:
    assert len(_dra_messages()) >= 5, "the DRA driver's messages moved: point _dra_messages at its package"


@pytest.mark.parametrize(("where", "fragment"), _dra_messages(), ids=[w for w, _ in _dra_messages()])
def test_every_dra_driver_message_is_quoted(where: str, fragment: str) -> None:
    assert len(fragment) >= 20, f"{where}: a message too short to find: {fragment!r}"
    assert _words(fragment) in _words(REFUSALS), f"docs/troubleshooting.md does not quote {where}: {fragment!r}"


def test_every_entry_says_what_you_see_why_what_to_check_and_the_fix() -> None:
    entries = REFUSALS.split("\n### ")[1:]
    assert entries
    for entry in entries:
        # An entry that shares them with another says so in one line: "Cause, check, fix: as ...".
        parts = ("**You see**", "**Cause, check, fix**") if "**Cause, check, fix**" in entry else (
            "**You see**", "**Cause**", "**Check**", "**Fix**")
        missing = [part for part in parts if part not in entry]
        assert missing == [], f"### {entry.splitlines()[0]} lacks {missing}"


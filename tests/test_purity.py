"""Decisions are pure: the contract, mutation, validation, review, signing, settings, certificate builders, the
plugin's deciding modules and the kubectl plugin's model and rendering import neither Flask, nor grpc, nor the
kubernetes client (CONTRIBUTING.md, rule 1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE = [
    "common.settings",
    "common.escape",
    "contract",
    "contract.keys",
    "contract.modes",
    "contract.errors",
    "contract.settings",
    "contract.demand",
    "contract.intent",
    "contract.assignment",
    "contract.allocation",
    "contract.pods",
    "contract.env",
    "contract.signing",
    "contract.holding",
    "contract.quantity",
    "contract.dra",
    "webhook.rules",
    "webhook.rules.review",
    "webhook.rules.envrules",
    "webhook.rules.mutate",
    "webhook.rules.validate",
    "webhook.rules.problems",
    "webhook.rules.create_rules",
    "webhook.rules.update_rules",
    "webhook.rules.shape",
    "webhook.rules.booking",
    "webhook.rules.identity",
    "webhook.rules.binding",
    "webhook.rules.admit",
    "webhook.server.settings",
    "certs.build",
    "deviceplugin.judge",
    "deviceplugin.offers",
    "deviceplugin.checkpoint",
    "deviceplugin.evidence",
    "deviceplugin.blame",
    "deviceplugin.trust",
    "deviceplugin.errors",
    "dra.slice",
    "dra.claims",
    "dra.cdispec",
    "dra.settings",
    "dra.kube",
    "deviceplugin.usage",
    "deviceplugin.pins",
    "deviceplugin.placement",
    "deviceplugin.delivery",
    "deviceplugin.devices",
    "deviceplugin.settings",
    "node.deadline",
    "node.inventory",
    "node.cdiedits",
    "node.settings",
    "kubectlplugin.events",
    "kubectlplugin.model",
    "kubectlplugin.render",
    "kubectlplugin.dra",
]
FORBIDDEN = ("flask", "werkzeug", "grpc", "kubernetes", "gunicorn")


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io_framework(module: str) -> None:
    probe = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} pulls in {out.stdout.strip()}"


def test_the_probe_can_fail() -> None:
    """The same probe sees a framework when one is imported, so the check above is not vacuous."""
    probe = "import sys, flask\nprint(','.join(m for m in sys.modules if m.split('.')[0] == 'flask'))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "flask" in out.stdout

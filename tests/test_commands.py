"""Every console script the package installs answers --help with its settings and defaults, and --version."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from certs.cli import VARIABLES as CERTS_VARIABLES
from common.cli import Variable
from deviceplugin.settings import PLUGIN_VARIABLES
from dra.settings import DRA_VARIABLES
from kubectlplugin.cli import VARIABLES as KUBECTL_PLUGIN_VARIABLES
from webhook.server.probe import PROBE_VARIABLES

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
BIN = Path(sys.executable).parent


def variables_of(script: str) -> tuple[Variable, ...]:
    from webhook.server.settings import WEBHOOK_VARIABLES

    return {
        "gpushare-webhook": WEBHOOK_VARIABLES, "gpushare-device-plugin": PLUGIN_VARIABLES,
        "gpushare-certs": CERTS_VARIABLES, "kubectl-gpushare": KUBECTL_PLUGIN_VARIABLES,
        "gpushare-dra-plugin": DRA_VARIABLES, "gpushare-dra-probe": DRA_VARIABLES,
        "gpushare-webhook-probe": PROBE_VARIABLES,
    }.get(script, ())


def run(script: str, flag: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / script), flag], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("script", SCRIPTS)
def test_version_comes_from_the_package_metadata(script: str) -> None:
    out = run(script, "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{script} {metadata.version('gpushare-webhook')}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_every_setting_with_its_default(script: str) -> None:
    out = run(script, "--help")
    assert out.returncode == 0, out.stderr
    assert "--version" in out.stdout
    text = " ".join(out.stdout.split())
    for variable in variables_of(script):
        assert variable.name in text
        assert ("(required)" if variable.required else f"(default: {variable.default or 'empty'})") in text

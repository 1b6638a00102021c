"""The plugin's deciding modules stay pure (STYLE.md rule 1), and only apiserver.py imports the kubernetes client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = ("flask", "werkzeug", "grpc", "kubernetes", "gunicorn")
PURE = ["deviceplugin.resolve", "deviceplugin.placement", "deviceplugin.delivery", "deviceplugin.inventory",
        "deviceplugin.settings"]


@pytest.mark.parametrize("module", PURE)
def test_deciding_modules_import_no_io_framework(module: str) -> None:
    probe = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} pulls in {out.stdout.strip()}"


def test_only_the_apiserver_adapter_imports_kubernetes() -> None:
    package = Path(__file__).resolve().parents[2] / "deviceplugin"
    starts = ("import kubernetes", "from kubernetes")
    importers = sorted(
        path.name
        for path in package.glob("*.py")
        if any(line.lstrip().startswith(starts) for line in path.read_text().splitlines())
    )
    assert importers == ["apiserver.py"]

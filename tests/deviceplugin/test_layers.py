"""One adapter per outside world: only the plugin's apiserver.py imports the kubernetes client (CONTRIBUTING.md 2).
The purity of the deciding modules is checked for the whole project in tests/test_purity.py."""

from __future__ import annotations

from pathlib import Path


def test_only_the_apiserver_adapter_imports_kubernetes() -> None:
    package = Path(__file__).resolve().parents[2] / "deviceplugin"
    starts = ("import kubernetes", "from kubernetes")
    importers = sorted(
        path.name
        for path in package.glob("*.py")
        if any(line.lstrip().startswith(starts) for line in path.read_text().splitlines())
    )
    assert importers == ["apiserver.py"]

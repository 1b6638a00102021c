"""One adapter per outside world: only the plugin's apiserver.py and node/apiclient.py under it import the kubernetes
client (CONTRIBUTING.md 2); the DRA driver reaches it through node/apiclient.py.
The purity of the deciding modules is checked for the whole project in tests/test_purity.py."""

from __future__ import annotations

from pathlib import Path


def test_only_the_apiserver_adapter_imports_kubernetes() -> None:
    root = Path(__file__).resolve().parents[2]
    starts = ("import kubernetes", "from kubernetes")
    importers = sorted(
        path.relative_to(root).as_posix()
        for package in ("node", "deviceplugin", "dra")
        for path in (root / package).glob("*.py")
        if any(line.lstrip().startswith(starts) for line in path.read_text().splitlines())
    )
    assert importers == ["deviceplugin/apiserver.py", "node/apiclient.py"]

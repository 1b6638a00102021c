"""The DRA driver's settings for tests that start it in-process."""

from __future__ import annotations

from pathlib import Path

from dra.settings import DraSettings, dra_settings_from
from tests.harness.dra.claims import NODE


def dra_settings(tmp: Path, **env: str) -> DraSettings:
    """Everything under `tmp` (short: a unix socket path holds 107 bytes); the keeper's thread never steps by
    itself, so the tests drive it with step()."""
    base = {
        "GPUSHARE_NODE_NAME": NODE, "GPUSHARE_FAKE_GPUS": "2x16GiB", "GPUSHARE_DRA_PLUGIN_DIR": f"{tmp}/plugin",
        "GPUSHARE_DRA_REGISTRY_DIR": f"{tmp}/registry", "GPUSHARE_DRA_STATE_DIR": f"{tmp}/state",
        "GPUSHARE_CDI_DIR": f"{tmp}/cdi", "GPUSHARE_FAKE_GPU_DIR": f"{tmp}/fake", "GPUSHARE_METRICS_BIND": "",
        "GPUSHARE_DRA_RESYNC_SECONDS": "3600",
    }
    return dra_settings_from({**base, **env})

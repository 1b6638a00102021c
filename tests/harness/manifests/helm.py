"""The Helm client, built once from its Go module by charts/build-helm.sh, and `helm template` of the chart."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "gpushare"
BUILD = REPO / "charts" / "build-helm.sh"
RELEASE = "gpushare"
# A cold build of helm takes minutes on a small machine; ./dev builds it before the tests start.
BUILD_TIMEOUT = 1800

Obj = dict[str, Any]


@functools.cache
def _built() -> tuple[str | None, str]:
    given = os.environ.get("GPUSHARE_HELM")
    if given and Path(given).is_file():
        return given, ""
    done = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    if done.returncode == 0:
        return done.stdout.strip().splitlines()[-1], ""
    lines = done.stderr.strip().splitlines() or [f"charts/build-helm.sh exited {done.returncode}"]
    if done.returncode == 3:  # no Go toolchain: the one case where the helm tests are skipped
        return None, lines[-1]
    raise AssertionError(f"charts/build-helm.sh failed (exit {done.returncode}):\n" + "\n".join(lines[-30:]))


def helm() -> str:
    """The helm binary; skips the test, saying why, only where Go is missing to build it."""
    path, reason = _built()
    if path is None:
        pytest.skip(reason)
    return path


def run(args: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=REPO)


def template(values: Path | None = None, sets: Sequence[str] = ()) -> list[Obj]:
    """The chart's objects, as `helm template` renders them (values file, then --set overrides)."""
    args = ["template", RELEASE, str(CHART)]
    if values is not None:
        args += ["--values", str(values)]
    for item in sets:
        args += ["--set", item]
    done = run(args)
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

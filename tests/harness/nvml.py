"""The fake NVML library and its go-nvml probe for tests: built once per source into the tier's cache."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e import fakenvml
from e2e.settings import from_environ

PROBE = Path(fakenvml.__file__).with_name("probe")


@functools.cache
def _library_dir() -> Path:
    return fakenvml.build(from_environ().cache_dir / "fakenvml")


def library_dir() -> Path:
    """The folder holding the fake libnvidia-ml.so.1; the test is skipped, with the reason, where gcc is missing."""
    try:
        return _library_dir()
    except fakenvml.BuildError as exc:
        pytest.skip(str(exc))


def probe_binary() -> Path:
    """The go-nvml probe (e2e/fakenvml/probe), built once per source; skipped with the reason where Go is missing."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if go is None:
        pytest.skip("Go is not installed, so the go-nvml probe of the fake NVML library cannot be built")
    sources = sorted(p for p in PROBE.iterdir() if p.is_file())
    key = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:16]
    binary = from_environ().cache_dir / "fakenvml-probe" / key / "probe"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        result = subprocess.run([go, "build", "-mod=readonly", "-o", str(partial), "."], cwd=PROBE,
                                capture_output=True, text=True, timeout=600, check=False,
                                env={**os.environ, "CGO_ENABLED": "1"})
        assert result.returncode == 0, f"go build of the go-nvml probe failed: {result.stderr[-3000:]}"
        partial.replace(binary)
    return binary


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any fake-NVML setting, plus `extra`."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_FAKE_NVML") and k != "LD_LIBRARY_PATH"}
    return {**keep, **extra}


def run_python(code: str, env: dict[str, str]) -> Any:
    """Runs `code` in a fresh interpreter (so the dynamic loader reads LD_LIBRARY_PATH) and returns the JSON it
    prints last."""
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, f"the NVML client failed: {result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])

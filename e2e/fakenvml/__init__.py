"""Builds the fake libnvidia-ml.so.1 (nvml.c) with the machine's gcc, cached by source hash; its environment."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

SOURCE = Path(__file__).with_name("nvml.c")
LIBRARY = "libnvidia-ml.so.1"  # the name nvidia-ml-py and go-nvml dlopen
GPUS_ENV = "GPUSHARE_FAKE_NVML_GPUS"
EVENTS_ENV = "GPUSHARE_FAKE_NVML_EVENTS"
_FLAGS = ("-shared", "-fPIC", "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror",
          "-fvisibility=hidden", f"-Wl,-soname,{LIBRARY}", "-pthread")


class BuildError(RuntimeError):
    """The fake NVML library could not be built; the text says why and what to install or fix."""


def build(cache_dir: Path) -> Path:
    """The folder holding libnvidia-ml.so.1 built from nvml.c, compiled once per source and flags."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    folder = cache_dir / key
    if (folder / LIBRARY).is_file():
        return folder
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("gcc is not installed, so the fake NVML library cannot be built; install gcc")
    folder.mkdir(parents=True, exist_ok=True)
    # Compile beside the target and rename: a concurrent build or reader never sees half a library.
    handle, partial = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
    os.close(handle)
    try:
        result = subprocess.run([gcc, *_FLAGS, "-o", partial, str(SOURCE)], capture_output=True, text=True,
                                timeout=120, check=False)
        if result.returncode != 0:
            raise BuildError(f"gcc could not build the fake NVML library from {SOURCE}: {result.stderr.strip()}")
        os.replace(partial, folder / LIBRARY)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return folder


def gpu_list(gpus: Iterable[tuple[int, str, int | None]]) -> str:
    """The GPUSHARE_FAKE_NVML_GPUS list for (MiB, UUID, minor number or None for no device node) per GPU."""
    return ",".join(f"{mib}:{uuid}:{'-' if minor is None else minor}" for mib, uuid, minor in gpus)


def environment(library_dir: Path, gpus: str, events: Path | None = None) -> dict[str, str]:
    """What a process needs to load the fake library in place of the real one and see these GPUs."""
    env = {"LD_LIBRARY_PATH": str(library_dir), GPUS_ENV: gpus}
    if events is not None:
        env[EVENTS_ENV] = str(events)
    return env


def inject_xid(events: Path, gpu: int | str, xid: int) -> None:
    """An XID critical error on a GPU (its index or UUID), seen by every event set registered for it."""
    # One append of one whole line: a waiting reader never sees a partial event.
    descriptor = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, f"{gpu} {xid}\n".encode())
    finally:
        os.close(descriptor)

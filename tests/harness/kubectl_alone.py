"""`kubectl gpushare` installed on its own: the kubectl-gpushare wheel built from a copy of the checkout, installed
with nothing else into a fresh virtual environment (the unit tier and the real-cluster tier use it alike)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

from kubectlplugin import krew

ROOT = Path(__file__).resolve().parents[2]
# What a clean clone holds that the wheel is built from (packaging/kubectl-gpushare reads the rest from the root).
COPIED = ("common", "contract", "kubectlplugin", "packaging", "pyproject.toml", "LICENSE")


def wheel_from_copy(clone: Path, out_dir: Path) -> Path:
    """The wheel, built from a copy at `clone` of what a clean clone holds (no build folder of an earlier run)."""
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, clone / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy(source, clone / name)
    return krew.build_wheel(out_dir, clone)


def _purelib(python: Path | str) -> str:
    return subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def install_alone(wheel: Path, home: Path) -> Path:
    """A fresh virtual environment at `home` with the wheel installed and nothing else; returns its python. This
    environment's packages come after its own (a .pth line, whose own .pth files Python does not run, so the
    editable install of the whole project stays out), for the kubernetes client without a package index."""
    venv.create(home, with_pip=False)
    python = home / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", "--disable-pip-version-check", str(wheel)], check=True, timeout=120)
    (Path(_purelib(python)) / "zz-test-environment.pth").write_text(_purelib(sys.executable) + "\n")
    return python

"""kubectl-gpushare's version is the project's: read from the repository's pyproject.toml, the one version source."""

import shutil
import tomllib
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1] / "pyproject.toml"

# setuptools packs whatever build/lib holds, also a module an earlier build copied there and py-modules no longer lists.
shutil.rmtree(HERE / "build", ignore_errors=True)
# egg_base: the metadata setuptools writes while building stays in this folder, not beside the repository's packages.
setup(version=tomllib.loads(PROJECT.read_text(encoding="utf-8"))["project"]["version"],
      options={"egg_info": {"egg_base": "."}})

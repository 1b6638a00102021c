"""The project's version, written once in pyproject.toml: the chart's version and appVersion, the image's tag and
the release's name all come from it."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def project_version(repo: Path = REPO) -> str:
    """`[project] version` of the repository's pyproject.toml."""
    with (repo / "pyproject.toml").open("rb") as file:
        version: str = tomllib.load(file)["project"]["version"]
    return version

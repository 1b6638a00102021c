"""gpushare_build_info: the installed distribution's version, or "unknown" said in the log, never a made-up one."""

from __future__ import annotations

import logging
import platform
import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from common.buildinfo import NAME, BuildInfo, installed_version
from common.cli import DISTRIBUTION

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_version_is_the_one_pyproject_gives_the_installed_distribution() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["name"] == DISTRIBUTION
    assert installed_version() == project["version"]


def test_a_missing_distribution_is_unknown_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="common.buildinfo")
    assert installed_version("gpushare-no-such-distribution") == "unknown"
    [record] = caplog.records
    assert "gpushare-no-such-distribution is not installed" in record.getMessage()


@pytest.mark.parametrize("program", ["webhook", "device-plugin", "dra-plugin"])
def test_one_sample_of_one_labelled_with_the_program_and_its_version(program: str) -> None:
    registry = CollectorRegistry()
    registry.register(BuildInfo(program))
    labels = {"program": program, "version": installed_version(), "python_version": platform.python_version()}
    assert registry.get_sample_value(NAME, labels) == 1
    assert [s.labels for f in registry.collect() for s in f.samples] == [labels]

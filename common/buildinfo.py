"""gpushare_build_info: the installed version of gpushare that a program runs, for its /metrics."""

from __future__ import annotations

import logging
import platform
from collections.abc import Iterator
from importlib import metadata

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.cli import DISTRIBUTION  # pyproject.toml's [project]: the one source of the version

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
NAME = "gpushare_build_info"
LABELS = ("program", "version", "python_version")


def installed_version(distribution: str = DISTRIBUTION) -> str:
    """The version of the installed distribution, or "unknown" (logged) where its metadata is missing: run from a
    checkout that was never installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        log.warning("The metadata of the distribution %s is not installed, so %s says version %r; install the "
                    "project (pip install .) to have its version reported.", distribution, NAME, UNKNOWN)
        return UNKNOWN


class BuildInfo(Collector):
    """One sample of value 1, labelled with the program, its version and the Python that runs it (the version is
    read once: it does not change while the program runs)."""

    def __init__(self, program: str, version: str | None = None) -> None:
        self.labels = (program, installed_version() if version is None else version, platform.python_version())

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(NAME, "Always 1: the gpushare program, its version and the Python it runs on.",
                                   labels=LABELS)
        family.add_metric(list(self.labels), 1)
        yield family

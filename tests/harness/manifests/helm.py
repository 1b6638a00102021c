"""The Helm client, built once from its Go module by charts/build-helm.sh, and `helm template` of the chart."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from charts.generate import KUBE_VERSION

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


@functools.cache
def version() -> str:
    """`helm version --short` of the helm the tests run: v4.3.2 by default, a v3 where GPUSHARE_HELM names one."""
    return run(["version", "--short"]).stdout.strip()


def _release(text: str) -> tuple[int, int, int]:
    found = re.match(r"v?(\d+)\.(\d+)\.(\d+)", text)
    if found is None:
        raise AssertionError(f"{text!r} is not a Kubernetes version")
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch)


OLDEST_KUBERNETES = KUBE_VERSION.removeprefix(">=").removesuffix("-0")  # the chart's kubeVersion: >=1.35.0-0


@functools.cache
def default_kube_version() -> str:
    """The Kubernetes version helm assumes without --kube-version (that of the client-go it was built with, as
    charts/build-helm.sh stamps it), read back from a chart of one template."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp)
        (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
        (chart / "templates").mkdir()
        (chart / "templates" / "probe.yaml").write_text("kube: {{ .Capabilities.KubeVersion.Version }}\n")
        done = run(["template", "probe", str(chart)])
    if done.returncode != 0:
        raise AssertionError(f"helm {version()} cannot render a chart of one template: {done.stderr.strip()}")
    return str(yaml.safe_load(done.stdout)["kube"])


def kube_version_args() -> list[str]:
    """--kube-version at the chart's oldest Kubernetes where helm would assume an older one (helm v3.19 assumes
    1.34), since the chart's kubeVersion refuses to render for those; nothing where helm's own is new enough."""
    if _release(default_kube_version()) >= _release(OLDEST_KUBERNETES):
        return []
    return ["--kube-version", OLDEST_KUBERNETES]


def template(values: Path | None = None, sets: Sequence[str] = (), set_json: Sequence[str] = (),
             api_versions: Sequence[str] = (), tests: bool = False) -> list[Obj]:
    """The chart's objects, as `helm template` renders them (values file, then --set and --set-json overrides).
    `api_versions` are what the cluster serves besides helm's defaults (group/version/Kind), as discovery tells
    `helm install`. `tests`: with the objects `helm test` creates (templates/tests/), which an install does not."""
    args = ["template", RELEASE, str(CHART), *kube_version_args(), *([] if tests else ["--skip-tests"])]
    for item in api_versions:
        args += ["--api-versions", item]
    if values is not None:
        args += ["--values", str(values)]
    for item in sets:
        args += ["--set", item]
    for item in set_json:
        args += ["--set-json", item]
    done = run(args)
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed under helm {version()}: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

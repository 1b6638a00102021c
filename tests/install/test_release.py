"""`./dev release --allow-dirty` of the working tree, as the install tier ran it (tests/harness/realtier/releases.py):
every artifact is there and agrees with the project's version and commit. The image and the chart the other tests
install are these."""

from __future__ import annotations

import json
import subprocess
import tarfile

import yaml

from charts.version import REPO, project_version
from release.artifacts import REF_NAME, REVISION_LABEL, VERSION_LABEL, image_config
from release.source import read_source
from tests.harness.realtier.releases import Releases


def test_every_artifact_is_in_sha256sums_and_checks(releases: Releases) -> None:
    artifacts = releases.current.artifacts
    done = subprocess.run(["sha256sum", "-c", artifacts.sums.name], cwd=artifacts.out, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    named = sorted(line.split("  ", 1)[1] for line in artifacts.sums.read_text().splitlines())
    every = (artifacts.image, artifacts.chart, artifacts.sbom, artifacts.changelog, artifacts.kubectl_wheel,
             artifacts.kubectl_archive, artifacts.krew_manifest)
    assert named == sorted(p.name for p in every)


def test_the_image_is_tagged_and_labelled_with_the_version_and_the_commit(releases: Releases) -> None:
    config = image_config(releases.current.artifacts.image)
    labels = config["config"]["Labels"]
    version = project_version()
    assert (config[REF_NAME], labels[VERSION_LABEL]) == (version, version)
    assert labels[REVISION_LABEL] == read_source(REPO, allow_dirty=True).revision
    assert config["config"]["User"] == "65532:65532"


def test_the_chart_is_packaged_with_the_version_as_version_and_app_version(releases: Releases) -> None:
    with tarfile.open(releases.current.artifacts.chart) as tar:
        member = tar.extractfile("gpushare/Chart.yaml")
        assert member is not None
        chart = yaml.safe_load(member.read())
    assert (chart["version"], chart["appVersion"]) == (project_version(), project_version())


def test_the_sbom_names_the_image_and_its_packages(releases: Releases) -> None:
    sbom = json.loads(releases.current.artifacts.sbom.read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    assert (sbom["metadata"]["component"]["name"], sbom["metadata"]["component"]["version"]) == (
        "gpushare", project_version())
    purls = {c.get("purl", "").split("@")[0] for c in sbom["components"]}
    assert {"pkg:pypi/gpushare-webhook", "pkg:pypi/grpcio", "pkg:pypi/flask"} <= purls
    assert any(p.startswith("pkg:deb/debian/python3.11") for p in purls), sorted(purls)[:20]


def test_the_changelog_is_the_versions_section(releases: Releases) -> None:
    assert releases.current.artifacts.changelog.read_text().startswith(f"## [{project_version()}]")

"""What a release is made from: one version for the project, the chart and the image; the changelog's section of a
version; the refusal of a tree with uncommitted changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from charts.generate import CHART, chart_yaml
from charts.model import ModelError
from charts.version import REPO, project_version
from release.source import ReleaseError, changelog_section, check_chart, read_source

CHANGELOG = """\
# Changelog

## [Unreleased]

### Fixed

- Not yet released.

## [0.2.0] - 2027-01-10

### Added

- Something new.

## [0.1.0] - 2026-12-04

The first release.

### Added

- Everything.

[0.2.0]: https://example.invalid/compare/v0.1.0...v0.2.0
"""


def test_the_chart_and_the_image_tag_are_the_project_version() -> None:
    version = project_version()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert (chart["version"], chart["appVersion"], values["image"]["tag"]) == (version, version, version)
    for overlay in ("cert-manager", "self-signed"):
        images = yaml.safe_load((REPO / "manifests" / overlay / "kustomization.yaml").read_text())["images"]
        assert [i["newTag"] for i in images if i["name"] == "gpushare"] == [version], overlay
    check_chart(REPO, version)


def test_a_chart_of_another_version_is_refused_naming_the_fields() -> None:
    with pytest.raises(ReleaseError, match=r"'version': '0\.1\.0'.*not the project's version 9\.9\.9"):
        check_chart(REPO, "9.9.9")


def test_the_generator_refuses_manifests_that_pin_another_image_tag() -> None:
    assert "version: 1.2.3\nappVersion: \"1.2.3\"\n" in chart_yaml({"image.tag": "1.2.3"}, "1.2.3")
    with pytest.raises(ModelError, match=r"image tag 0\.0\.9 is not the project's version 1\.2\.3"):
        chart_yaml({"image.tag": "0.0.9"}, "1.2.3")


def test_the_changelog_has_a_section_for_the_project_version() -> None:
    version = project_version()
    assert changelog_section((REPO / "CHANGELOG.md").read_text(), version).startswith(f"## [{version}]")


@pytest.mark.parametrize(("version", "first", "last"), [
    ("0.2.0", "## [0.2.0] - 2027-01-10", "- Something new."),
    ("0.1.0", "## [0.1.0] - 2026-12-04", "- Everything."),  # the link definitions at the end are left out
    ("Unreleased", "## [Unreleased]", "- Not yet released."),
])
def test_a_section_runs_from_its_heading_to_the_next(version: str, first: str, last: str) -> None:
    lines = changelog_section(CHANGELOG, version).splitlines()
    assert (lines[0], lines[-1]) == (first, last)
    assert not any(line.startswith("## ") for line in lines[1:])


@pytest.mark.parametrize(("text", "version", "message"), [
    (CHANGELOG, "0.3.0", r"no section `## \[0\.3\.0\]`"),
    (CHANGELOG, "0.1", r"no section `## \[0\.1\]`"),  # a prefix of 0.1.0 is not its section
    ("## [0.3.0] - 2027-02-01\n\n## [0.2.0]\n- x\n", "0.3.0", r"section `## \[0\.3\.0\]` is empty"),
])
def test_a_version_without_its_section_is_refused(text: str, version: str, message: str) -> None:
    with pytest.raises(ReleaseError, match=message):
        changelog_section(text, version)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1.2.3"\n')
    (tmp_path / ".gitignore").write_text("dist/\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_clean_tree_gives_its_commit_and_version(repo: Path) -> None:
    (repo / "dist").mkdir()
    (repo / "dist" / "ignored").write_text("x")  # what git ignores is no change
    source = read_source(repo)
    assert (source.version, source.commit, source.dirty) == ("1.2.3", _git(repo, "rev-parse", "HEAD").strip(), False)
    assert source.revision == source.commit


@pytest.mark.parametrize("change", ["modified", "untracked", "staged"])
def test_a_tree_with_changes_is_refused_unless_allowed(repo: Path, change: str) -> None:
    if change == "untracked":
        (repo / "new.py").write_text("x = 1\n")
    else:
        (repo / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1.2.4"\n')
        if change == "staged":
            _git(repo, "add", "pyproject.toml")
    with pytest.raises(ReleaseError, match=r"not committed \((new\.py|pyproject\.toml)\).*--allow-dirty"):
        read_source(repo)
    source = read_source(repo, allow_dirty=True)
    assert source.dirty and source.revision == source.commit + "-dirty"

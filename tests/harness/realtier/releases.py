"""The release artifacts the install tier installs from: the working tree's, built by `./dev release --allow-dirty`
into the tier's cache, and a tagged release's, built by that tag's own `python -m release` in a `git worktree` of
it. Both are cached, the first by the commit and the uncommitted changes, the second by the tag's commit, and each
image archive is unpacked into an OCI layout that the tier's registry serves (e2e.registry --oci-layout).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from charts.version import project_version
from e2e.cluster import REPO, Cluster
from e2e.projectimage import ProjectImage, key_of
from e2e.settings import E2eSettings
from e2e.toolchain import Toolchain
from release.artifacts import Artifacts
from release.source import ReleaseError, changed_paths

BUILD_TIMEOUT = 3600  # a first build makes the image's base, the image, and syft


@dataclass(frozen=True)
class Release:
    artifacts: Artifacts
    layout: Path  # the image archive, unpacked: what the registry serves as gpushare-e2e/gpushare:<version>

    @property
    def version(self) -> str:
        return self.artifacts.version

    @property
    def image(self) -> ProjectImage:
        return ProjectImage(self.layout, self.version)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"`git {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def source_key(repo: Path = REPO) -> str:
    """The commit, and every uncommitted change to it: two trees with one key build the same artifacts."""
    parts = [_git(repo, "rev-parse", "HEAD").encode(), _git(repo, "diff", "HEAD", "--binary").encode()]
    for name in sorted(changed_paths(repo)):
        path = repo / name
        parts.append(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b""))
    return key_of(*parts)


def version_at(repo: Path, commit: str) -> str:
    """`[project] version` of pyproject.toml at `commit`."""
    version: str = tomllib.loads(_git(repo, "show", f"{commit}:pyproject.toml"))["project"]["version"]
    return version


def previous_tag(repo: Path, version: str) -> str | None:
    """The newest tag `v*` in HEAD's history whose version is not `version`: the release an upgrade comes from (the
    tag of `version` itself, while no newer version is tagged, is the current release, not a previous one)."""
    for tag in _git(repo, "tag", "--list", "v*", "--merged", "HEAD", "--sort=-v:refname").split():
        if tag.removeprefix("v") != version:
            return tag
    return None


def _unpacked(artifacts: Artifacts) -> Release:
    layout = artifacts.out.with_name(artifacts.out.name + ".layout")
    if not (layout / "index.json").is_file():
        partial = layout.with_name(layout.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(artifacts.image) as tar:
            tar.extractall(partial, filter="data")
        partial.rename(layout)
    return Release(artifacts, layout)


def _build(argv: list[str], cwd: Path, out: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run([*argv, "--out", str(out)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"`{' '.join(argv)}` in {cwd} failed (exit {done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-4000:]}")


def current(settings: E2eSettings, repo: Path = REPO) -> Release:
    """The working tree's release, built by `./dev release --allow-dirty` where the cache lacks it; the cached
    builds of other trees go."""
    root = settings.cache_dir / "release" / "current"
    out = root / source_key(repo)
    if not (out / "SHA256SUMS").is_file():
        _build([str(repo / "dev"), "release", "--allow-dirty"], repo, out)
        for other in root.iterdir():
            if other.name.split(".")[0] != out.name:
                shutil.rmtree(other, ignore_errors=True)
    return _unpacked(Artifacts(out, project_version(repo)))


def has_release_build(repo: Path, commit: str) -> bool:
    """Whether the tree of `commit` has `./dev release` (release/build.py)."""
    return _git(repo, "ls-tree", "--name-only", commit, "release/build.py").strip() == "release/build.py"


def tagged(settings: E2eSettings, tag: str, repo: Path = REPO) -> Release:
    """The release of `tag`, built by the tag's own release code in a git worktree of it where the cache lacks it."""
    commit = _git(repo, "rev-parse", f"{tag}^{{commit}}").strip()
    out = settings.cache_dir / "release" / "tags" / commit
    if not (out / "SHA256SUMS").is_file():
        worktree = settings.cache_dir / "release" / "worktrees" / commit
        if worktree.exists():
            _git(repo, "worktree", "remove", "--force", str(worktree))
        _git(repo, "worktree", "add", "--detach", str(worktree), commit)
        try:
            # The tag's own modules first on the path (the virtual environment's editable install is this tree's).
            env = {**os.environ, "PYTHONPATH": str(worktree)}
            _build([sys.executable, "-m", "release"], worktree, out, env)
        finally:
            _git(repo, "worktree", "remove", "--force", str(worktree))
    return _unpacked(Artifacts(out, version_at(repo, commit)))


@dataclass(frozen=True)
class Releases:
    """What the install tier installs: the current release, and the previous one or why there is none."""

    current: Release
    previous: Release | None
    no_previous: str  # why `previous` is None; empty when it is not
    previous_failed: bool = False  # there is a previous release, but its artifacts could not be built

    def cluster(self, settings: E2eSettings, toolchain: Toolchain) -> Cluster:
        """The tier's cluster with the current release's image and chart, and the previous release's image too."""
        extra = (self.previous.layout,) if self.previous is not None else ()
        return Cluster(settings, replace(toolchain, image=self.current.image), extra_layouts=extra,
                       chart=self.current.artifacts.chart)


def releases(settings: E2eSettings, repo: Path = REPO) -> Releases:
    """The previous release first: its build replaces the image cache's entry (e2e.projectimage keeps one), which
    the current one then rebuilds and keeps for the tier's own image."""
    version = project_version(repo)
    tag = previous_tag(repo, version)
    if tag is None:
        return Releases(current(settings, repo), None, f"no tag v* in this commit's history has a version other than "
                        f"{version}, so there is no previous release to upgrade from until the next version is tagged "
                        "(docs/release.md).")
    if not has_release_build(repo, f"{tag}^{{commit}}"):
        return Releases(current(settings, repo), None, f"the previous release {tag} predates `./dev release` (its tree "
                        "has no release/build.py), so its artifacts cannot be built.")
    try:
        previous = tagged(settings, tag, repo)
    except ReleaseError as exc:
        return Releases(current(settings, repo), None, f"the previous release {tag} could not be built: {exc}", True)
    return Releases(current(settings, repo), previous, "")

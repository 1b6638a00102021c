"""What a release is made from: the project's version, the git commit and whether the tree is clean, and the
version's section of CHANGELOG.md."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from charts.version import REPO, project_version


class ReleaseError(Exception):
    """The release cannot be built; the text says why and what to do."""


@dataclass(frozen=True)
class Source:
    repo: Path
    version: str  # pyproject.toml's [project] version
    commit: str  # HEAD's full hash
    dirty: bool  # tracked changes or untracked files that git does not ignore

    @property
    def revision(self) -> str:
        """The image's org.opencontainers.image.revision: the commit, marked when the tree had changes besides it."""
        return f"{self.commit}-dirty" if self.dirty else self.commit


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"`git {' '.join(args)}` failed in {repo}: {done.stderr.strip()}")
    return done.stdout


def changed_paths(repo: Path) -> list[str]:
    """Tracked files that differ from HEAD and untracked files that git does not ignore, as `git status` names them."""
    return [line[3:] for line in _git(repo, "status", "--porcelain", "--untracked-files=all").splitlines() if line]


def read_source(repo: Path = REPO, *, allow_dirty: bool = False) -> Source:
    """The release's source, refusing a tree with changes unless `allow_dirty` (development builds only)."""
    changed = changed_paths(repo)
    if changed and not allow_dirty:
        listed = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ReleaseError(f"The working tree has changes that are not committed ({listed}), so the artifacts would "
                           "not be those of any commit: commit or stash them and run `./dev release` again "
                           "(`--allow-dirty` builds them anyway, for development only).")
    return Source(repo, project_version(repo), _git(repo, "rev-parse", "HEAD").strip(), bool(changed))


def check_chart(repo: Path, version: str) -> None:
    """charts/gpushare's version and appVersion, and its default image tag, are the project's version."""
    chart = repo / "charts" / "gpushare"
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    values = yaml.safe_load((chart / "values.yaml").read_text())
    found = {"version": meta.get("version"), "appVersion": meta.get("appVersion"),
             "image.tag": (values.get("image") or {}).get("tag")}
    wrong = {name: value for name, value in found.items() if str(value) != version}
    if wrong:
        raise ReleaseError(f"charts/gpushare has {wrong}, not the project's version {version} (pyproject.toml): set "
                           "newTag in manifests/cert-manager and manifests/self-signed to it and run `./dev chart`.")


_HEADING = re.compile(r"^## (?P<title>.*)$")


def changelog_section(text: str, version: str) -> str:
    """The section of `version` in a Keep a Changelog file: its `## [version]` heading and every line up to the
    next `## ` heading or the link definitions at the end."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if (m := _HEADING.match(line))
                  and re.match(rf"\[?{re.escape(version)}\]?(\s|$)", m["title"])), None)
    if start is None:
        raise ReleaseError(f"CHANGELOG.md has no section `## [{version}]`: write what changed in {version} there "
                           "(docs/release.md) and run `./dev release` again.")
    end = next((i for i in range(start + 1, len(lines))
                if _HEADING.match(lines[i]) or re.match(r"^\[[^\]]+\]: ", lines[i])), len(lines))
    body = lines[start + 1:end]
    if not any(line.strip() for line in body):
        raise ReleaseError(f"CHANGELOG.md's section `## [{version}]` is empty: say what changed in {version}.")
    return "\n".join([lines[start], *body]).strip() + "\n"

"""The install tier's release artifacts, without a cluster: which tag is the previous release, the cache key of the
working tree, a tag's build in a git worktree of it, and the cluster that serves both images."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from e2e import toolchain
from e2e.settings import E2eSettings
from release.artifacts import Artifacts
from tests.harness.realtier import releases
from tests.harness.realtier.releases import Release, Releases

# The release module of a tag's tree, as far as the harness sees it: `python -m release --out DIR` writes the
# archive and SHA256SUMS there, and says which tree it ran in.
STUB = """\
import io, json, pathlib, sys, tarfile, tomllib
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
version = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]["version"]
out.mkdir(parents=True)
with tarfile.open(out / f"gpushare-{version}.oci.tar", "w") as tar:
    data = json.dumps({"built in": str(pathlib.Path.cwd())}).encode()
    info = tarfile.TarInfo("index.json"); info.size = len(data); tar.addfile(info, io.BytesIO(data))
(out / "SHA256SUMS").write_text("")
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def _commit(repo: Path, version: str, tag: str | None = None, release_module: bool = True) -> None:
    (repo / "pyproject.toml").write_text(f'[project]\nname = "x"\nversion = "{version}"\n')
    if release_module:
        (repo / "release").mkdir(exist_ok=True)
        (repo / "release" / "__main__.py").write_text(STUB)
        (repo / "release" / "build.py").write_text("")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "--allow-empty", "-m", version)
    if tag:
        _git(repo, "tag", tag)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    (root / ".gitignore").write_text("__pycache__/\n")
    return root


@pytest.mark.parametrize(("history", "version", "expected"), [
    ([("0.1.0", "v0.1.0")], "0.1.0", None),  # the first release is the current one, not a previous one
    ([("0.1.0", "v0.1.0"), ("0.2.0", None)], "0.2.0", "v0.1.0"),  # the next version, not yet tagged
    ([("0.1.0", "v0.1.0"), ("0.2.0", "v0.2.0"), ("0.2.0", None)], "0.2.0", "v0.1.0"),
    ([("0.9.0", "v0.9.0"), ("0.10.0", "v0.10.0"), ("0.11.0", None)], "0.11.0", "v0.10.0"),  # by version, not text
    ([("0.1.0", None)], "0.1.0", None),  # nothing tagged
])
def test_the_previous_release_is_the_newest_tag_of_another_version(
        repo: Path, history: list[tuple[str, str | None]], version: str, expected: str | None) -> None:
    for each, tag in history:
        _commit(repo, each, tag)
    assert releases.previous_tag(repo, version) == expected


def test_a_tag_outside_the_history_is_no_previous_release(repo: Path) -> None:
    _commit(repo, "0.1.0", "v0.1.0")
    _git(repo, "checkout", "-q", "-b", "other")
    _commit(repo, "0.3.0", "v0.3.0")
    _git(repo, "checkout", "-q", "-")
    _commit(repo, "0.2.0")
    assert releases.previous_tag(repo, "0.2.0") == "v0.1.0"


def test_the_source_key_follows_uncommitted_changes(repo: Path) -> None:
    _commit(repo, "0.1.0")
    clean = releases.source_key(repo)
    assert releases.source_key(repo) == clean
    (repo / "new.txt").write_text("a")
    untracked = releases.source_key(repo)
    (repo / "new.txt").write_text("b")
    assert len({clean, untracked, releases.source_key(repo)}) == 3
    (repo / "new.txt").unlink()
    (repo / "pyproject.toml").write_text("changed\n")
    assert releases.source_key(repo) not in (clean, untracked)


def test_a_tag_is_built_in_a_worktree_of_it_once(repo: Path, tmp_path: Path) -> None:
    _commit(repo, "0.1.0", "v0.1.0")
    _commit(repo, "0.2.0")
    settings = E2eSettings(cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", port_base=30000)
    built = releases.tagged(settings, "v0.1.0", repo)
    assert built.version == "0.1.0" and built.artifacts.image.name == "gpushare-0.1.0.oci.tar"
    where = json.loads((built.layout / "index.json").read_text())["built in"]
    assert where == str(settings.cache_dir / "release" / "worktrees" / _git(repo, "rev-parse", "v0.1.0").strip())
    assert _git(repo, "worktree", "list").count("\n") == 1, "the worktree is removed after the build"
    (built.artifacts.out / "SHA256SUMS").write_text("cached\n")
    assert releases.tagged(settings, "v0.1.0", repo).artifacts.sums.read_text() == "cached\n"


def test_a_tag_without_release_code_is_named_as_such(repo: Path, tmp_path: Path) -> None:
    _commit(repo, "0.0.9", "v0.0.9", release_module=False)
    _commit(repo, "0.1.0")
    assert not releases.has_release_build(repo, "v0.0.9")
    assert releases.has_release_build(repo, "HEAD")


def test_the_cluster_serves_both_images_and_installs_the_packaged_chart(tmp_path: Path) -> None:
    settings = E2eSettings(cache_dir=tmp_path, run_dir=tmp_path / "run", port_base=30000)
    tools = toolchain.Toolchain(release=settings.release, kubernetes=tmp_path, containerd=tmp_path,
                                pause=tmp_path / "pause", cert_manager=tmp_path, runc=tmp_path, cni_bin=tmp_path,
                                busybox=tmp_path)
    current = Release(Artifacts(tmp_path / "current", "0.2.0"), tmp_path / "current.layout")
    previous = Release(Artifacts(tmp_path / "previous", "0.1.0"), tmp_path / "previous.layout")
    cluster = Releases(current, previous, "").cluster(settings, tools)
    assert cluster.toolchain.image is not None
    assert (cluster.toolchain.image.layout, cluster.toolchain.image.tag) == (current.layout, "0.2.0")
    assert cluster.extra_layouts == (previous.layout,)
    assert cluster.chart == tmp_path / "current" / "gpushare-0.2.0.tgz"
    assert Releases(current, None, "none").cluster(settings, tools).extra_layouts == ()



"""`./dev release`: the artifacts of the project's version, built from a clean tree into dist/release/<version>/.

    python -m release                 # refuses a tree with uncommitted changes
    python -m release --allow-dirty   # development only: the image's revision label says <commit>-dirty
    python -m release --out DIR       # another folder (the install tier builds into its cache)

The image is the one the real-cluster tier builds from the Dockerfile (e2e.projectimage: buildah on a base made with
mmdebstrap, cached by the build context), written as an OCI archive with the release's version and revision labels;
the chart is `helm package` of charts/gpushare; the SBOM is syft's CycloneDX document of that archive; the kubectl
plugin comes as its wheel, its krew archive and the krew manifest; SHA256SUMS covers every file. docs/release.md
says how to cut a release and verify it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.settings import SettingsError
from e2e import projectimage
from e2e.install import InstallError, helm_binary
from e2e.settings import E2eSettings
from e2e.settings import from_environ as e2e_from_environ
from e2e.toolchain import NEWER_GO
from kubectlplugin import krew
from release.artifacts import REVISION_LABEL, VERSION_LABEL, Artifacts, sha256sums, write_oci_archive
from release.source import ReleaseError, Source, changelog_section, check_chart, read_source

SYFT_PACKAGE = "github.com/anchore/syft/cmd/syft"
PARTIAL = ".partial"  # the staging folder's suffix: build() renames it to the release folder at the end
SYFT_VERSION = "v1.57.2"  # the newest syft release the Go module proxy served when this was written


@dataclass(frozen=True)
class ReleaseSettings:
    tools_cache: Path  # Go tools built once by version, beside charts/build-helm.sh's helm (GPUSHARE_TOOLS_CACHE)
    e2e: E2eSettings  # where e2e.projectimage keeps buildah's storage and the built image (GPUSHARE_E2E_CACHE)
    download_url: str | None = None  # where the artifacts will be published (GPUSHARE_RELEASE_DOWNLOAD_URL)


def from_environ(environ: Mapping[str, str] | None = None) -> ReleaseSettings:
    env = os.environ if environ is None else environ
    cache = env.get("GPUSHARE_TOOLS_CACHE") or str(Path(env.get("HOME", "/root")) / ".cache" / "gpushare-tools")
    url = env.get("GPUSHARE_RELEASE_DOWNLOAD_URL", "").strip() or None
    if url is not None and not url.startswith(("https://", "http://", "file://")):
        raise SettingsError(f"GPUSHARE_RELEASE_DOWNLOAD_URL={url!r} is not a URL: give the https:// address of the "
                            "folder the release's files are published in, or leave it unset")
    return ReleaseSettings(tools_cache=Path(cache), e2e=e2e_from_environ(env), download_url=url)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(argv: list[str], what: str, env: dict[str, str] | None = None, timeout: float = 1800) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")


def syft_binary(settings: ReleaseSettings) -> Path:
    """syft, built once from its Go module (`go install`) into the tools cache; with NEWER_GO where the module's go
    directive asks for a newer Go than the machine's."""
    target = settings.tools_cache / f"syft-{SYFT_VERSION}" / "syft"
    if target.is_file():
        return target
    if shutil.which("go") is None:
        raise ReleaseError("syft (the SBOM tool) cannot be built: the Go toolchain (go) is not on PATH; install Go "
                           "1.26 or newer and run `./dev release` again.")
    staging = target.parent.with_name(target.parent.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    env = {**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false -trimpath",
           "GOTOOLCHAIN": "local"}
    _say(f"Building syft {SYFT_VERSION} from its Go module into {target.parent} (once; a few minutes) ...")
    # The version stamp of syft's own release build (.goreleaser.yaml ldflags): the SBOM names the tool that made it.
    stamp = f"-X main.version={SYFT_VERSION.removeprefix('v')}"
    argv = ["go", "install", "-ldflags", stamp, f"{SYFT_PACKAGE}@{SYFT_VERSION}"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600, check=False)
    if done.returncode != 0 and "requires go >=" in done.stderr:
        _run(argv, f"go install of syft {SYFT_VERSION} with {NEWER_GO}", env={**env, "GOTOOLCHAIN": NEWER_GO},
             timeout=3600)
    elif done.returncode != 0:
        raise ReleaseError(f"go install of syft {SYFT_VERSION} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    shutil.rmtree(target.parent, ignore_errors=True)
    staging.rename(target.parent)
    return target


def image_step(source: Source, artifacts: Artifacts, settings: ReleaseSettings) -> None:
    """The Dockerfile's image (built where e2e.projectimage's cache lacks it) as an OCI archive tagged with the
    version, labelled with the version and the commit."""
    try:
        built = projectimage.build(settings.e2e)
    except projectimage.ImageError as exc:
        raise ReleaseError(f"The image could not be built: {exc}") from None
    labels = {VERSION_LABEL: source.version, REVISION_LABEL: source.revision}
    write_oci_archive(built.layout, built.tag, artifacts.image, source.version, labels)


def chart_step(source: Source, artifacts: Artifacts, settings: ReleaseSettings) -> None:
    """`helm package` of charts/gpushare, whose version and appVersion check_chart has held to the project's."""
    try:
        helm = helm_binary()
    except InstallError as exc:
        raise ReleaseError(f"helm is needed to package the chart: {exc}") from None
    _run([helm, "package", str(source.repo / "charts" / "gpushare"), "--destination", str(artifacts.out)],
         "helm package of charts/gpushare")
    if not artifacts.chart.is_file():
        raise ReleaseError(f"helm package wrote no {artifacts.chart.name}; charts/gpushare/Chart.yaml names another "
                           "chart or version.")


def sbom_step(source: Source, artifacts: Artifacts, settings: ReleaseSettings) -> None:
    """syft's CycloneDX SBOM of the image archive: the Debian packages of the base and the Python packages of the
    virtual environment. Offline: no update check."""
    syft = syft_binary(settings)
    env = {**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false"}
    # Named as the image, not as the archive's path in the staging folder.
    _run([str(syft), "scan", f"oci-archive:{artifacts.image}", "--quiet", "--source-name", "gpushare",
          "--source-version", source.version, "-o", f"cyclonedx-json={artifacts.sbom}"],
         "syft scan of the image archive", env=env)


def kubectl_plugin_step(source: Source, artifacts: Artifacts, settings: ReleaseSettings) -> None:
    """`kubectl gpushare` on its own (kubectlplugin/krew.py): its wheel (`pip install` it), the krew archive of the
    wheel and its launcher, and the krew manifest naming the archive where it will be downloaded from
    (GPUSHARE_RELEASE_DOWNLOAD_URL; without it, the release folder itself, for `kubectl krew install --manifest`)."""
    wheel = krew.build_wheel(artifacts.out, source.repo)
    if wheel != artifacts.kubectl_wheel:
        raise ReleaseError(f"the kubectl plugin's wheel is {wheel.name}, not {artifacts.kubectl_wheel.name}: is "
                           "packaging/kubectl-gpushare's version the project's?")
    archive = artifacts.kubectl_archive
    digest = krew.write_archive(wheel, archive, source.repo)
    final = artifacts.out.with_name(artifacts.out.name.removesuffix(PARTIAL))  # where build() renames the folder
    base = settings.download_url.rstrip("/") if settings.download_url else final.resolve().as_uri()
    document = krew.manifest(source.version, f"{base}/{archive.name}", digest)
    artifacts.krew_manifest.write_text(yaml.safe_dump(document, sort_keys=False))


Step = Callable[[Source, Artifacts, ReleaseSettings], None]
# In order; SHA256SUMS comes last, over every file the steps wrote.
STEPS: tuple[tuple[str, Step], ...] = (("image", image_step), ("chart", chart_step), ("sbom", sbom_step),
                                       ("kubectl plugin", kubectl_plugin_step))


def build(source: Source, out: Path, settings: ReleaseSettings,
          steps: tuple[tuple[str, Step], ...] = STEPS) -> Artifacts:
    """Every artifact of `source` into `out`, replacing what was there; written next to it first, so that a failed
    build leaves no folder that looks complete."""
    check_chart(source.repo, source.version)
    notes = changelog_section((source.repo / "CHANGELOG.md").read_text(), source.version)
    partial = out.with_name(out.name + PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    staged = Artifacts(partial, source.version)
    staged.changelog.write_text(notes)
    for name, step in steps:
        _say(f"release {source.version}: {name} ...")
        step(source, staged, settings)
    staged.sums.write_text(sha256sums(staged.built()))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return Artifacts(out, source.version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev release", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allow-dirty", action="store_true",
                        help="DEVELOPMENT ONLY: build from a tree with uncommitted changes; never publish the result")
    parser.add_argument("--out", type=Path, help="the folder to build into (default: dist/release/<version>)")
    args = parser.parse_args(argv)
    try:
        settings = from_environ()
        source = read_source(allow_dirty=args.allow_dirty)
        if source.dirty:
            _say(f"DEVELOPMENT BUILD: the tree has uncommitted changes; the image's revision label says "
                 f"{source.revision}. Do not publish these artifacts.")
        out = args.out or source.repo / "dist" / "release" / source.version
        artifacts = build(source, out.absolute(), settings)
    except (ReleaseError, SettingsError) as exc:
        _say(str(exc))
        return 1
    for path in [*artifacts.built(), artifacts.sums]:
        print(path)
    _say(f"Release {source.version} ({source.revision}) is in {artifacts.out}; check it with "
         f"`cd {artifacts.out} && sha256sum -c {artifacts.sums.name}`.")
    return 0

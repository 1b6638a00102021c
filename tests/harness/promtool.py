"""promtool, Prometheus's rule checker and rule unit-test runner, built once from its Go module into a versioned
cache folder (as charts/build-helm.sh builds helm), and `promtool test rules` of generated test files.

    python -m tests.harness.promtool   # build it where missing and print its path (./dev test does, before pytest)

GPUSHARE_PROMTOOL names a promtool to use instead; GPUSHARE_TOOLS_CACHE the cache folder (~/.cache/gpushare-tools).
Where Go is missing the tests that need promtool are skipped with that reason, as the helm tests are; any other
build failure fails them with the build's output.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.toolchain import go_directive, toolchain_for

# Prometheus's Go module is tagged v0.<major><minor>.<patch>: v0.316.0 is Prometheus 3.16.0.
VERSION = os.environ.get("GPUSHARE_PROMTOOL_VERSION", "v0.316.0")
MODULE = "github.com/prometheus/prometheus"
# A cold build takes minutes on a small machine; ./dev test builds it before the tests start.
BUILD_TIMEOUT = 1800
NO_GO = 3  # the exit status of `python -m tests.harness.promtool` where Go is missing


class NoGo(Exception):
    """The Go toolchain is not on PATH, so promtool cannot be built."""


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if go is None:
        raise NoGo(f"promtool cannot be built: the Go toolchain (go) is not on PATH; install Go to build "
                   f"{MODULE}/cmd/promtool@{VERSION}")
    return go


def build() -> Path:
    """The cached promtool, built with `go install` into <cache>/promtool-<VERSION>/ where missing."""
    given = os.environ.get("GPUSHARE_PROMTOOL")
    if given and Path(given).is_file():
        return Path(given)
    cache = Path(os.environ.get("GPUSHARE_TOOLS_CACHE") or Path.home() / ".cache" / "gpushare-tools")
    binary = cache / f"promtool-{VERSION}" / "promtool"
    if binary.is_file():
        return binary
    go = _go()
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false -trimpath"}
    downloaded = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], env=env,
                                capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    if downloaded.returncode != 0:
        raise AssertionError(f"go mod download {MODULE}@{VERSION} failed: {downloaded.stdout[-2000:]}"
                             f"{downloaded.stderr[-2000:]}")
    newer = toolchain_for(go_directive(Path(json.loads(downloaded.stdout)["GoMod"]).read_text()), env)
    if newer is not None:
        env["GOTOOLCHAIN"] = newer
    print(f"Building promtool {VERSION} from its Go module into {binary.parent} (once; a few minutes) ...",
          file=sys.stderr, flush=True)
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=binary.parent, prefix="partial-") as staging:
        done = subprocess.run([go, "install", "-ldflags", "-s -w", f"{MODULE}/cmd/promtool@{VERSION}"],
                              env={**env, "GOBIN": staging}, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                              check=False)
        if done.returncode != 0:
            raise AssertionError(f"go install of promtool {VERSION} failed (exit {done.returncode}):\n"
                                 f"{done.stderr[-4000:]}")
        (Path(staging) / "promtool").replace(binary)
    return binary


@functools.cache
def _built() -> tuple[Path | None, str]:
    try:
        return build(), ""
    except NoGo as exc:
        return None, str(exc)


def promtool() -> Path:
    """The promtool binary; skips the test, saying why, only where Go is missing to build it."""
    path, reason = _built()
    if path is None:
        pytest.skip(reason)
    return path


def check_rules(rules: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool()), "check", "rules", str(rules)], capture_output=True, text=True,
                          timeout=60, check=False)


def run_tests(rules: Path, tests: list[dict[str, Any]], folder: Path, name: str) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` of one file holding `tests` (promtool's test groups) against the rule file `rules`."""
    path = folder / f"{name}.test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False))
    return subprocess.run([str(promtool()), "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=120, check=False)


def main() -> int:
    try:
        print(build())
    except NoGo as exc:
        print(exc, file=sys.stderr)
        return NO_GO
    except AssertionError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

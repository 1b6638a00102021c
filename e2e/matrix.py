"""The version matrix: the parts of the real-cluster tier that can differ between Kubernetes releases, on every row
of e2e/versions.py, and one table release x check with pass/fail and the bug report's time.

    python -m e2e.matrix                     # every release of the table (./dev e2e --matrix)
    python -m e2e.matrix v1.36.3 v1.37.2     # these releases only
    python -m e2e.matrix --write-readme      # and write the last result of every release into README.md
    python -m e2e.matrix --kept --write-readme   # run nothing: the last kept results, into README.md

Each release gets its own clusters, one after the other: the tier's checks in one pytest run, the install tier's in
another (each starts and stops its own cluster). A check passes when every test it selects passed and at least one
ran; "skip" means all were skipped (the line of the run says why). Each release's last result is kept, with its
date and commit, in the tier's cache (`matrix/<version>.json`), so the README's table can hold releases run at
different times, each column saying when and on what.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from e2e import versions
from e2e.settings import from_environ

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RECORD_VARIABLE = "GPUSHARE_E2E_RECORD"  # a JSON-lines file where the bug report's tests write their time


@dataclass(frozen=True)
class Check:
    name: str
    tier: str  # "tests/e2e" or "tests/install": which pytest run holds its tests
    files: tuple[str, ...]  # the test files it selects (relative to the tier)
    matches: Callable[[str], bool] = lambda test: True  # which tests of those files (by test name)
    helm: str = ""  # a helm release other than charts/build-helm.sh's default (GPUSHARE_HELM_VERSION)

    @property
    def run(self) -> tuple[str, str]:
        """The pytest run that holds its tests: one per tier and helm."""
        return (self.tier, self.helm)


def _bug_report(delivery: str) -> Callable[[str], bool]:
    """The scenario test's bug-report case in one delivery, whatever order pytest puts the two parameters in."""
    def matches(test: str) -> bool:
        return (test.startswith("test_every_container_on_its_pods_gpu[") and "the-bug-report" in test
                and re.search(rf"[\[-]{delivery}[\]-]", test) is not None)
    return matches


HELM_3 = "v3.19.5"  # the chart works with Helm 3 as well as with Helm 4, charts/build-helm.sh's default

CHECKS: tuple[Check, ...] = (
    Check("install: helm install, upgrade, rollback, uninstall", "tests/install",
          ("test_install.py", "test_install_cert_manager.py")),
    Check(f"install with Helm 3 ({HELM_3}): install, scenarios, uninstall", "tests/install", ("test_install.py",),
          helm=HELM_3),
    Check("bug report, env, real extender", "tests/e2e", ("test_scenario.py",), _bug_report("env")),
    Check("bug report, cdi, real extender", "tests/e2e", ("test_scenario.py",), _bug_report("cdi")),
    Check("plugin and kubelet restarts", "tests/e2e", ("test_restarts.py",)),
    Check("DRA", "tests/e2e", ("test_dra.py",)),
    Check("DRA installed", "tests/install", ("test_install_dra.py",)),
    Check("admission and policies", "tests/e2e",
          ("test_security.py", "test_refusals.py", "test_plugin_identity.py", "test_kubectl.py")),
)


def record(check: str, delivery: str, seconds: float | None) -> None:
    """Called by the bug report's tests: their time, for the matrix's table (nothing unless the matrix runs)."""
    path = os.environ.get(RECORD_VARIABLE)
    if path and seconds is not None:
        with open(path, "a") as handle:
            handle.write(json.dumps({"check": check, "delivery": delivery, "seconds": round(seconds, 1)}) + "\n")


@dataclass
class Row:
    release: str
    results: dict[str, str] = field(default_factory=dict)  # check name -> pass / FAIL / skip / not run
    times: dict[str, float] = field(default_factory=dict)  # "env" / "cdi" / "dra" -> seconds of the bug report
    error: str = ""
    measured: str = ""  # "<date> on <commit>" of the run


def _commit() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True, check=False).stdout.strip()
    return commit + (" with local changes" if dirty else "")


def save(row: Row, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{row.release}.json").write_text(json.dumps(row.__dict__, indent=1))


def saved(folder: Path) -> list[Row]:
    """The last result of every release of the table that has one, oldest release first."""
    rows = []
    for release in versions.RELEASES:
        path = folder / f"{release.kubernetes}.json"
        if path.exists():
            rows.append(Row(**json.loads(path.read_text())))
    return rows


def _verdicts(junit: Path) -> dict[tuple[str, str], str]:
    """(file name, test name) -> pass / fail / skip from a pytest JUnit XML file."""
    found: dict[tuple[str, str], str] = {}
    if not junit.exists():
        return found
    for case in ET.parse(junit).iter("testcase"):
        module = (case.get("classname") or "").split(".")[-1] + ".py"
        outcome = "pass"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "fail"
        elif case.find("skipped") is not None:
            outcome = "skip"
        found[(module, case.get("name") or "")] = outcome
    return found


def judge(check: Check, verdicts: dict[tuple[str, str], str]) -> str:
    mine = [v for (module, test), v in verdicts.items() if module in check.files and check.matches(test)]
    if not mine:
        return "not run"
    if "fail" in mine:
        return "FAIL"
    return "pass" if "pass" in mine else "skip"


def run_release(version: str, python: str) -> Row:
    row = Row(version, measured=f"{datetime.date.today().isoformat()} on {_commit()}")
    with tempfile.TemporaryDirectory(prefix="gpushare-matrix-") as work:
        record_file = Path(work) / "record.jsonl"
        env = {**os.environ, "GPUSHARE_E2E": "1", "GPUSHARE_E2E_KUBERNETES": version,
               RECORD_VARIABLE: str(record_file)}
        built = subprocess.run([python, "-m", "e2e.toolchain"], cwd=REPO, env=env, check=False,
                               stdout=subprocess.DEVNULL)
        if built.returncode != 0:
            row.error = f"the toolchain for {version} could not be built (exit {built.returncode}; lines above)"
            row.results = {c.name: "not run" for c in CHECKS}
            return row
        verdicts: dict[tuple[str, str], dict[tuple[str, str], str]] = {}
        for index, (tier, helm) in enumerate(dict.fromkeys(c.run for c in CHECKS)):
            files = sorted({f"{tier}/{f}" for c in CHECKS if c.run == (tier, helm) for f in c.files})
            junit = Path(work) / f"run-{index}.xml"
            print(f"== {version}{f' with helm {helm}' if helm else ''}: {' '.join(files)}", file=sys.stderr,
                  flush=True)
            run_env = {**env, "GPUSHARE_HELM_VERSION": helm} if helm else env
            subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *files],
                           cwd=REPO, env=run_env, check=False)
            subprocess.run([python, "-m", "e2e.cluster", "down"], cwd=REPO, env=env, check=False,
                           stdout=subprocess.DEVNULL)
            verdicts[(tier, helm)] = _verdicts(junit)
        row.results = {c.name: judge(c, verdicts.get(c.run, {})) for c in CHECKS}
        if record_file.exists():
            for line in record_file.read_text().splitlines():
                entry = json.loads(line)
                row.times.setdefault(entry["delivery"], entry["seconds"])
    return row


def table(rows: Iterable[Row]) -> str:
    rows = list(rows)
    head = "| check | " + " | ".join(r.release for r in rows) + " |"
    lines = [head, "|---|" + "---|" * len(rows)]
    for check in CHECKS:
        lines.append(f"| {check.name} | " + " | ".join(r.results.get(check.name, "not run") for r in rows) + " |")
    for key, label in (("env", "env"), ("cdi", "cdi"), ("dra", "DRA claims")):
        cells = [f"{r.times[key]:.0f} s" if key in r.times else "-" for r in rows]
        lines.append(f"| bug report, first create to last start, {label} | " + " | ".join(cells) + " |")
    if any(r.measured for r in rows):
        lines.append("| measured | " + " | ".join(r.measured or "-" for r in rows) + " |")
    return "\n".join(lines)


BEGIN = "<!-- version matrix: written by `./dev e2e --matrix --write-readme` -->"
END = "<!-- end of version matrix -->"


def write_readme(text: str, readme: Path = README) -> None:
    """Replace the README's matrix block with `text` (whose last row says when and on which commit each release
    ran)."""
    block = f"{BEGIN}\n{text}\n{END}"
    current = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(current):
        raise SystemExit(f"{readme} has no version matrix block ({BEGIN} ... {END}); add one where it belongs")
    readme.write_text(pattern.sub(lambda _: block, current))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.matrix", description=__doc__.split("\n")[0])
    parser.add_argument("releases", nargs="*", help="Kubernetes versions of e2e/versions.py (default: all)")
    parser.add_argument("--write-readme", action="store_true", help="write the table into README.md")
    parser.add_argument("--kept", action="store_true", help="run nothing; print the last kept result of each release")
    args = parser.parse_args(argv)
    kept = from_environ().cache_dir / "matrix"
    if args.kept:
        rows = saved(kept)
        if not rows:
            print(f"no release has a kept result in {kept}: run ./dev e2e --matrix first", file=sys.stderr)
            return 1
        print(table(rows))
        if args.write_readme:
            write_readme(table(rows))
        return 0 if rows else 1
    try:
        chosen = [versions.release(v).kubernetes for v in args.releases] or [r.kubernetes for r in versions.RELEASES]
    except versions.UnknownRelease as exc:
        print(exc, file=sys.stderr)
        return 2
    rows = []
    for version in chosen:
        row = run_release(version, sys.executable)
        save(row, kept)
        rows.append(row)
    print(table(rows))
    for row in rows:
        if row.error:
            print(f"{row.release}: {row.error}", file=sys.stderr)
    if args.write_readme:
        write_readme(table(saved(kept)))
    failed = any(v in ("FAIL", "not run") for r in rows for v in r.results.values()) or any(r.error for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

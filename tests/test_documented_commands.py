"""The commands of README.md and docs/troubleshooting.md run as written: those that need no cluster here, the others
on the install tier (tests/install/test_documented_commands.py); and the README stays an operator's page."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import doccommands

pytestmark = pytest.mark.timeout(120)

REPO = doccommands.REPO
README = REPO / "README.md"
LOCAL = [(block, command) for block, command in doccommands.local_commands()
         if doccommands.shown(command) not in doccommands.NOT_RUN_AS_WRITTEN]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_an_operators_page() -> None:
    assert len(README.read_bytes()) < 15_000, "README.md is for operators: move the rest into docs/"


def test_the_two_promised_commands_come_first_in_the_readme() -> None:
    first = doccommands.blocks("README.md")[0]
    assert [doccommands.shown(c) for c in first.commands] == ["./dev serve", "./dev test"]
    assert first.line < 30, "the two commands stay near the top"


@pytest.mark.parametrize("doc", doccommands.DOCS)
def test_every_link_resolves(doc: str) -> None:
    text = (REPO / doc).read_text()
    folder = (REPO / doc).parent
    missing = [target for target in _LINK.findall(text) if "://" not in target
               and not (folder / target).exists()]
    assert missing == []


def test_every_block_is_a_command_for_a_cluster_or_for_here() -> None:
    blocks = doccommands.all_blocks()
    assert blocks and all(block.commands for block in blocks), [str(b) for b in blocks if not b.commands]
    cluster = [doccommands.shown(c) for b in doccommands.cluster_blocks() for c in b.commands]
    for expected in ("helm install", "helm upgrade", "helm uninstall", "kubectl gpushare"):
        assert any(c.startswith(expected) for c in cluster), f"no cluster command starts {expected!r}: {cluster}"


def test_the_tier_knows_every_placeholder_of_the_cluster_commands() -> None:
    words = {w for b in doccommands.cluster_blocks() for c in b.commands for w in re.findall(r"\b[A-Z][A-Z_]+\b", c)}
    assert words <= set(doccommands.PLACEHOLDERS)


def test_every_exception_is_a_documented_command() -> None:
    local = {doccommands.shown(command) for _, command in doccommands.local_commands()}
    assert set(doccommands.NOT_RUN_AS_WRITTEN) <= local


@pytest.mark.parametrize(("block", "command"), LOCAL, ids=[doccommands.shown(c) for _, c in LOCAL])
def test_a_command_that_needs_no_cluster_runs_as_written(block: doccommands.Block, command: str,
                                                         tmp_path: Path) -> None:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    program = doccommands.programs(command)[0][0]
    if shutil.which(program, path=path) is None and not (REPO / program).exists():
        pytest.skip(f"{program} is not installed here (./dev test installs kubectl)")
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env={**os.environ, "PATH": path, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{block}: {done.stderr or done.stdout}"
    assert done.stdout.strip(), f"{block}: `{command}` printed nothing"


def test_dev_test_runs_ruff_mypy_and_pytest() -> None:
    """`./dev test` is not run from within its own suite; its case in `dev` is what the README says it does."""
    script = (REPO / "dev").read_text()
    case = script[script.index("\n    test)\n"):]
    case = case[:case.index(";;")]
    assert all(tool in case for tool in ('/bin/ruff" check .', '/bin/mypy"', '-m pytest')), case

"""The shell blocks of the operator's documents, as commands: which need a cluster, which do not, and which are
checked another way than as written (tests/test_documented_commands.py, tests/install/test_documented_commands.py)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/troubleshooting.md")
LANGUAGES = ("sh", "bash", "console")
_FENCE = re.compile(r"^```(\w*)\s*$")
# What a reader replaces in a cluster command: the image they pushed, and the node, namespace and pod they mean.
IMAGE = "registry.example.com/gpushare"
PLACEHOLDERS = ("NODE", "NAMESPACE", "POD")
# Subcommands that talk to a cluster; every other use of these programs works offline (helm template, kubectl
# kustomize, --help, --version).
_CLUSTER = {
    "helm": {"install", "upgrade", "uninstall", "rollback", "status", "list", "get", "history", "test"},
    "gpushare-certs": {"install", "rotate"},
}
_OFFLINE_KUBECTL = {"kustomize", "completion", "plugin"}
# Local commands that are not run as written, each with why and what checks it instead.
NOT_RUN_AS_WRITTEN = {
    "./dev test": "it is this suite (ruff, mypy and every test: minutes); checked instead: `dev` has the subcommand "
                  "and it runs ruff, mypy --strict and pytest (tests/test_documented_commands.py)",
    "./dev serve": "it serves until stopped; checked instead: started as written with a free port and a temporary "
                   "certificate folder, it answers its sample review over TLS and is stopped "
                   "(tests/webhook/server/test_serve.py, the `./dev serve` case)",
}


@dataclass(frozen=True)
class Block:
    """One fenced shell block of a document."""

    doc: str
    line: int  # of the opening fence, 1-based
    language: str
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def commands(self) -> tuple[str, ...]:
        return tuple(commands(self.text, console=self.language == "console"))

    @property
    def needs_cluster(self) -> bool:
        return any(needs_cluster(command) for command in self.commands)


def blocks(doc: str) -> list[Block]:
    """Every ```sh, ```bash and ```console block of `doc` (relative to the repository), in order."""
    found: list[Block] = []
    opened: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate((REPO / doc).read_text().splitlines(), 1):
        fence = _FENCE.match(line)
        if opened is None and line.startswith("```"):
            opened, body = (number, fence.group(1) if fence else ""), []
        elif opened is not None and fence and not fence.group(1):
            if opened[1] in LANGUAGES:
                found.append(Block(doc, opened[0], opened[1], "\n".join(body)))
            opened = None
        elif opened is not None:
            body.append(line)
    return found


def commands(text: str, *, console: bool = False) -> list[str]:
    """The commands of a block: comment lines left out, a line ending in a backslash or inside an open quote joined
    with the next; in a console block only the lines after a `$ ` prompt (the rest is output)."""
    lines = text.splitlines()
    if console:
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    out: list[str] = []
    pending = ""
    for line in lines:
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        out.append(pending)
        pending = ""
    if pending:
        raise ValueError(f"a command never ends: {pending!r}")
    return out


def programs(command: str) -> list[list[str]]:
    """The simple commands of `command` as words (split at ;, &&, || and |)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    simple: list[list[str]] = [[]]
    for word in lexer:
        if word and set(word) <= set(";&|"):
            simple.append([])
        else:
            simple[-1].append(word)
    return [words for words in simple if words]


def needs_cluster(command: str) -> bool:
    for words in programs(command):
        program, rest = words[0], words[1:]
        if "--help" in rest or "--version" in rest:
            continue
        if program == "kubectl":
            if not rest or rest[0] in _OFFLINE_KUBECTL or rest[:2] == ["version", "--client"]:
                continue
            return True
        if rest and rest[0] in _CLUSTER.get(program, ()):
            return True
    return False


def all_blocks() -> list[Block]:
    return [block for doc in DOCS for block in blocks(doc)]


def cluster_blocks() -> list[Block]:
    """The blocks the real-cluster tier runs against an installed release, in the documents' order."""
    return [block for block in all_blocks() if block.needs_cluster]


def local_commands() -> list[tuple[Block, str]]:
    """The commands of the blocks that need no cluster, each with its block."""
    return [(block, command) for block in all_blocks() if not block.needs_cluster for command in block.commands]


def shown(command: str) -> str:
    """A command without its trailing comment, as an exception of NOT_RUN_AS_WRITTEN names it."""
    return " ".join(shlex.join(words) for words in programs(command))

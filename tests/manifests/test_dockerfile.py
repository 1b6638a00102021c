"""The Dockerfile, read as instructions (no Docker engine here): stages, pinned base, numeric non-root user."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PINNED = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")
BUILD_TOOLS = ("gcc", "g++", "make", "build-essential", "cargo", "rustc", "clang")


@dataclass
class Stage:
    image: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and backslash continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def stages(text: str) -> list[Stage]:
    args: dict[str, str] = {}
    out: list[Stage] = []
    for word, rest in instructions(text):
        if word == "ARG" and not out:
            name, _, default = rest.partition("=")
            args[name] = default
        elif word == "FROM":
            parts = [p for p in rest.split() if not p.startswith("--")]
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(out))
            out.append(Stage(image, name))
        else:
            assert out, f"{word} before the first FROM"
            out[-1].instructions.append((word, rest))
    return out


def the_stages() -> list[Stage]:
    return stages((ROOT / "Dockerfile").read_text())


def test_instruction_parser_joins_continuations_and_resolves_args() -> None:
    parsed = stages("ARG B=python:3.11.9-slim-bookworm\nFROM ${B} AS x\n# c\nRUN a \\\n  && b\nFROM x\nUSER 1:1\n")
    assert [(s.image, s.name) for s in parsed] == [("python:3.11.9-slim-bookworm", "x"), ("x", "1")]
    assert parsed[0].instructions == [("RUN", "a && b")]


def test_multi_stage_with_pinned_bases() -> None:
    found = the_stages()
    assert len(found) >= 2
    names = {s.name for s in found}
    for stage in found:
        assert stage.image in names or PINNED.match(stage.image), f"stage {stage.name} base {stage.image} is not pinned"


def test_final_stage_runs_as_a_numeric_non_root_user() -> None:
    final = the_stages()[-1]
    users = [rest for word, rest in final.instructions if word == "USER"]
    assert users, "the final stage sets no USER, so it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0
    assert not gid or (gid.isdigit() and int(gid) > 0)
    webhook = yaml.safe_load((ROOT / "manifests/base/webhook.yaml").read_text().split("\n---\n")[2])
    assert webhook["kind"] == "Deployment"
    assert webhook["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)


def test_final_stage_has_no_build_tools_and_copies_only_built_results() -> None:
    final = the_stages()[-1]
    for word, rest in final.instructions:
        if word == "RUN":
            assert "pip install" not in rest and not any(re.search(rf"\b{t}\b", rest) for t in BUILD_TOOLS), rest
        if word in ("COPY", "ADD"):
            assert rest.startswith("--from="), f"the final stage copies {rest!r} from the build context"
    build = the_stages()[0]
    install = " ".join(rest for word, rest in build.instructions if word == "RUN")
    assert "pip uninstall --yes pip" in install


def test_image_carries_every_entry_point() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"gpushare-webhook", "gpushare-device-plugin", "gpushare-certs"} <= set(scripts)
    build = the_stages()[0]
    copied = " ".join(rest for word, rest in build.instructions if word == "COPY")
    for package in {target.split(".")[0] for target in scripts.values()}:
        assert package in copied.split() or f"{package}" in copied, f"package {package} is not copied"
        assert (ROOT / package).is_dir()
    # webhook.server.serve execs gunicorn with the gunicorn.conf.py beside the webhook package.
    assert "gunicorn.conf.py" in copied and (ROOT / "gunicorn.conf.py").is_file()
    final = the_stages()[-1]
    cmd = [rest for word, rest in final.instructions if word == "CMD"]
    assert cmd == ['["gpushare-webhook"]']


@pytest.mark.parametrize("path", ["pyproject.toml", "README.md", "LICENSE", "gunicorn.conf.py", "common/", "contract/",
                                  "webhook/", "deviceplugin/", "certs/", "kubectlplugin/"])
def test_dockerignore_keeps_what_the_build_copies(path: str) -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*", "the context should be an allow-list, so .venv, .git and keys never reach the daemon"
    assert f"!{path}" in rules


def test_every_package_is_installed_copied_and_let_into_the_context() -> None:
    """pyproject's packages, the Dockerfile's COPY lines, .dockerignore's allow-list and the tier's image context
    name the same packages, so a new package cannot be left out of the image."""
    from e2e.projectimage import CONTEXT

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {name.removesuffix("*") for name in include}
    copied = {rest.split()[0] for word, rest in the_stages()[0].instructions
              if word == "COPY" and not rest.startswith("--") and len(rest.split()) == 2}
    allowed = {ln.strip()[1:].rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip().startswith("!") and ln.strip().endswith("/")}
    in_context = {name for name in CONTEXT if (ROOT / name).is_dir()}
    assert packages == copied == allowed == in_context

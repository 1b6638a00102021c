"""What every gpushare command line shares: `--version` from the package metadata and a settings table for `--help`."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata

DISTRIBUTION = "gpushare-webhook"


@dataclass(frozen=True)
class Variable:
    """One environment variable a command reads: its name, its default as text, and what it sets."""

    name: str
    default: str
    meaning: str
    required: bool = False


def package_version(distributions: Sequence[str] = (DISTRIBUTION,)) -> str:
    """The version of the first of `distributions` that is installed."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown (not installed; run `pip install -e .`)"


def settings_help(variables: Sequence[Variable], intro: str = "Settings (environment variables):") -> str:
    """The epilog of a --help: each variable, its meaning and its default (or that it is required)."""
    width = max(len(v.name) for v in variables)
    lines = [intro]
    for v in variables:
        head = f"  {v.name.ljust(width)}  "
        text = f"{v.meaning} (" + ("required" if v.required else f"default: {v.default or 'empty'}") + ")"
        wrapped = textwrap.wrap(text, width=max(40, 118 - len(head)), break_on_hyphens=False, break_long_words=False)
        lines.append(head + wrapped[0])
        lines.extend(" " * len(head) + rest for rest in wrapped[1:])
    return "\n".join(lines)


def parser(
    prog: str, description: str, variables: Sequence[Variable] = (), epilog: str = "",
    distributions: Sequence[str] = (DISTRIBUTION,),
) -> argparse.ArgumentParser:
    """An ArgumentParser with --version and, in its --help, the command's settings and their defaults."""
    parts = [settings_help(variables)] if variables else []
    if epilog:
        parts.append(epilog)
    out = argparse.ArgumentParser(
        prog=prog, description=description, epilog="\n\n".join(parts) or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    out.add_argument("--version", action="version", version=f"{prog} {package_version(distributions)}")
    return out

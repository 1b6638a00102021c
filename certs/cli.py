"""`gpushare-certs`: write development certificates and signing keys; one argparse subcommand per module."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from certs import commands
from certs.build import DEFAULT_NAMESPACE, DEFAULT_SERVICE, DEV_HOSTS, SECRET_FILES, dev_bundle
from common import cli

VARIABLES = (
    cli.Variable("KUBECONFIG", "~/.kube/config", "install, rotate, signing-key: the kubeconfig when --kubeconfig is "
                 "not given (--in-cluster: the pod's ServiceAccount instead)"),
)

DEV_FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key", "signing.key", "signing.pub")

Subparsers = Any  # argparse's _SubParsersAction is private; each register() adds one subcommand to it.
Command = Callable[[argparse.Namespace], int]


def write_files(out: Path, files: Mapping[str, bytes]) -> None:
    """Write each file atomically (temp file + rename); private keys readable by the owner only."""
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        try:
            os.fchmod(fd, 0o600 if name in SECRET_FILES else 0o644)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, out / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def missing_dev_files(out: Path) -> list[str]:
    return [name for name in DEV_FILES if not (out / name).is_file()]


def _dev(args: argparse.Namespace) -> int:
    out = Path(args.out)
    present = [name for name in DEV_FILES if (out / name).exists()]
    if present and not args.force:
        print(
            f"{out} already holds {', '.join(present)}; nothing was written. Pass --force to replace them "
            "(every client must then trust the new ca.crt and every plugin needs the new signing.pub).",
            file=sys.stderr,
        )
        return 1
    hosts = list(dict.fromkeys([*DEV_HOSTS, *args.host]))
    files = dev_bundle(
        datetime.datetime.now(datetime.UTC), service=args.service, namespace=args.namespace, extra_hosts=hosts
    )
    try:
        write_files(out, files)
    except OSError as exc:
        print(f"Could not write to {out} ({exc.strerror}); choose a writable --out directory.", file=sys.stderr)
        return 1
    print(f"Wrote {', '.join(DEV_FILES)} to {out} for service {args.service}.{args.namespace}.svc.")
    return 0


def register_dev(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "dev", help="write a development CA, serving certificate and intent-signing key pair to a directory"
    )
    parser.add_argument("--out", required=True, help="directory to write ca.crt, ca.key, tls.*, signing.*")
    parser.add_argument("--service", default=DEFAULT_SERVICE, help="webhook Service name (default %(default)s)")
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="its namespace (default %(default)s)")
    parser.add_argument(
        "--host", action="append", default=[], help="extra DNS name or IP for the certificate (repeatable)"
    )
    parser.add_argument("--force", action="store_true", help="replace files that already exist")
    parser.set_defaults(command=_dev)


# One entry per subcommand module; a cluster `install`/`rotate` command adds its register function here.
REGISTRARS: tuple[Callable[[Subparsers], None], ...] = (register_dev, commands.register)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser(
        "gpushare-certs", "Certificates and intent-signing keys for the gpushare webhook.", VARIABLES,
        "`gpushare-certs COMMAND --help` lists a command's flags and their defaults. Exit status: 0 done, 1 the "
        "cluster refused or failed a step (run the command again), 2 bad flags or credentials.",
    )
    subparsers = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    for register in REGISTRARS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: Command = args.command
    return command(args)


if __name__ == "__main__":
    sys.exit(main())

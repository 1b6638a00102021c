"""Development certificates and keys for `gpushare-webhook --dev`: made once in a directory, kept after."""

from __future__ import annotations

import datetime
from pathlib import Path

from certs.build import dev_bundle
from certs.cli import missing_dev_files, write_files


def ensure_dev_files(directory: Path) -> dict[str, str]:
    """Create development certificates and keys where missing; the GPUSHARE_* variables that point at them."""
    if missing_dev_files(directory):
        print(f"Creating development certificates and keys in {directory} ...")
        write_files(directory, dev_bundle(datetime.datetime.now(datetime.UTC)))
    return {
        "GPUSHARE_TLS_CERT": str(directory / "tls.crt"),
        "GPUSHARE_TLS_KEY": str(directory / "tls.key"),
        "GPUSHARE_SIGNING_KEY": str(directory / "signing.key"),
    }

"""certs.devcerts: development certificates are made once, and the variables point at them."""

from __future__ import annotations

from pathlib import Path

import pytest

from certs.cli import missing_dev_files
from certs.devcerts import ensure_dev_files


def test_made_once_then_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = ensure_dev_files(tmp_path)
    assert capsys.readouterr().out == f"Creating development certificates and keys in {tmp_path} ...\n"
    assert files == {
        "GPUSHARE_TLS_CERT": str(tmp_path / "tls.crt"),
        "GPUSHARE_TLS_KEY": str(tmp_path / "tls.key"),
        "GPUSHARE_SIGNING_KEY": str(tmp_path / "signing.key"),
    }
    assert not missing_dev_files(tmp_path)
    made = {name: (tmp_path / name).read_bytes() for name in ("tls.crt", "tls.key", "signing.key")}
    assert ensure_dev_files(tmp_path) == files
    assert capsys.readouterr().out == ""
    assert {name: (tmp_path / name).read_bytes() for name in made} == made

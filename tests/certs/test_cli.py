"""`gpushare-certs dev`: files written with safe permissions, existing files kept unless --force."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from certs.cli import DEV_FILES, build_parser, main, missing_dev_files


def test_dev_writes_every_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dev"
    assert main(["dev", "--out", str(out), "--host", "webhook.local"]) == 0
    assert missing_dev_files(out) == []
    assert "Wrote ca.crt" in capsys.readouterr().out
    for name in DEV_FILES:
        mode = stat.S_IMODE((out / name).stat().st_mode)
        assert mode == (0o600 if name.endswith(".key") else 0o644), name
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "webhook.local" in names.get_values_for_type(x509.DNSName)
    assert list(out.glob(".*")) == []  # no temp files left behind


def test_dev_keeps_existing_files_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev", "--out", str(tmp_path)]) == 0
    before = (tmp_path / "ca.crt").read_bytes()
    assert main(["dev", "--out", str(tmp_path)]) == 1
    assert "Pass --force to replace them" in capsys.readouterr().err
    assert (tmp_path / "ca.crt").read_bytes() == before
    assert main(["dev", "--out", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "ca.crt").read_bytes() != before


def test_unwritable_directory_is_a_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["dev", "--out", str(blocker / "sub")]) == 1
    assert "choose a writable --out directory" in capsys.readouterr().err


def test_subcommand_is_required() -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([])
    assert exited.value.code == 2

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra.checkpoint import FILE_NAME, Checkpoint, CheckpointError, PreparedClaim, encode
from dra.claims import ClaimRef, Share
from tests.harness.dra.claims import NODE, REF

PREPARED = {
    REF.uid: PreparedClaim(REF, (Share("a", NODE, "gpu-0", 0, 4, "s-a"), Share("b", NODE, "gpu-1", 1, 2, ""))),
    "uid-2": PreparedClaim(ClaimRef("other", "c2", "uid-2"), ()),
}


def test_round_trip(tmp_path: Path) -> None:
    Checkpoint(str(tmp_path)).save(PREPARED)
    assert Checkpoint(str(tmp_path)).load() == PREPARED
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME]  # no temporary file left behind


def test_missing_file_is_an_empty_record(tmp_path: Path) -> None:
    assert Checkpoint(str(tmp_path / "not-yet")).load() == {}


def _edited(change: Callable[[dict[str, Any]], None]) -> str:
    doc = json.loads(encode(PREPARED))
    change(doc)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"version": 1, "checksum": ', "Expecting value"),
        ("[]", "does not have exactly the fields"),
        (_edited(lambda d: d.update(version=2)), "has version 2"),
        (_edited(lambda d: d["claims"][0]["shares"][0].update(units=40)), "checksum does not match"),
        (_edited(lambda d: d.update(extra=1)), "does not have exactly the fields"),
        (_edited(lambda d: d.update(version=True)), "version is not of type int"),
    ],
    ids=["truncated", "not-an-object", "version", "edited", "extra-field", "bool-version"],
)
def test_corrupt_file_is_refused_naming_file_and_fix(tmp_path: Path, text: str, words: str) -> None:
    (tmp_path / FILE_NAME).write_text(text)
    with pytest.raises(CheckpointError, match=words) as caught:
        Checkpoint(str(tmp_path)).load()
    assert str(tmp_path / FILE_NAME) in str(caught.value)
    assert "delete the file" in str(caught.value)


def test_schema_is_checked_under_a_matching_checksum(tmp_path: Path) -> None:
    from dra import checkpoint

    claims = [{"namespace": "n", "name": "c", "uid": "u", "shares": [{"request": "a"}]}]
    text = json.dumps({"version": 1, "checksum": checkpoint._checksum(claims), "claims": claims})
    (tmp_path / FILE_NAME).write_text(text)
    with pytest.raises(CheckpointError, match=r"claims\[0\].shares\[0\] does not have exactly the fields"):
        Checkpoint(str(tmp_path)).load()

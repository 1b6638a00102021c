from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest

from dra.cdispec import PreparedDevice
from dra.checkpoint import FILE_NAME, Checkpoint, CheckpointError, PreparedClaim
from dra.claims import ClaimError, ClaimRef, Share
from dra.driver import Driver
from node.cdi import CdiStore
from node.inventory import Inventory
from tests.harness.dra.claims import GPUS, NODE, REF, UID, claim, result
from tests.harness.dra.fakes import FakeClaims


def make_driver(root: Path, source: FakeClaims) -> Driver:
    return Driver(NODE, Inventory(GPUS, "GiB"), "GiB", source=source, checkpoint=Checkpoint(str(root / "state")),
                  cdi=CdiStore(str(root / "cdi")), fake_gpu_dir=str(root / "fake"))


@pytest.fixture
def source() -> FakeClaims:
    return FakeClaims(claim(result("gpu-0", "4Gi", request="a"), result("gpu-1", "2Gi", request="b")))


def test_prepare_writes_spec_and_fake_gpu_file_and_records_it(tmp_path: Path, source: FakeClaims) -> None:
    devices = make_driver(tmp_path, source).prepare(REF)
    assert devices == [PreparedDevice("a", NODE, "gpu-0", (f"gpushare.io/gpu=dra-{UID}-0",)),
                       PreparedDevice("b", NODE, "gpu-1", (f"gpushare.io/gpu=dra-{UID}-1",))]
    spec = json.loads((tmp_path / "cdi" / f"gpushare-dra-{UID}.json").read_text())
    assert [d["name"] for d in spec["devices"]] == [f"dra-{UID}-0", f"dra-{UID}-1"]
    fake_file = tmp_path / "fake" / "GPU-1111bbbb.txt"
    assert fake_file.read_text() == "index=1\nuuid=GPU-1111bbbb\n"
    assert spec["devices"][1]["containerEdits"]["mounts"][0]["hostPath"] == str(fake_file)
    assert Checkpoint(str(tmp_path / "state")).load()[UID].shares == (
        Share("a", NODE, "gpu-0", 0, 4, "share-1"), Share("b", NODE, "gpu-1", 1, 2, "share-1"))


def test_restart_answers_from_the_checkpoint_without_reading(tmp_path: Path, source: FakeClaims) -> None:
    first = make_driver(tmp_path, source).prepare(REF)
    source.failure = RuntimeError("the API server is gone")
    again = make_driver(tmp_path, source)
    assert again.prepare(REF) == first
    assert source.reads == 1


def test_unprepare_removes_spec_and_record_and_survives_restart(tmp_path: Path, source: FakeClaims) -> None:
    make_driver(tmp_path, source).prepare(REF)
    restarted = make_driver(tmp_path, source)
    restarted.unprepare(REF)
    assert list((tmp_path / "cdi").iterdir()) == []
    assert restarted.prepared() == {}
    assert make_driver(tmp_path, source).prepared() == {}
    restarted.unprepare(REF)  # unknown now: still fine


def test_refused_claim_leaves_nothing_behind(tmp_path: Path) -> None:
    driver = make_driver(tmp_path, FakeClaims(claim(result(pool="node-b"))))
    with pytest.raises(ClaimError, match="not of this node's pool"):
        driver.prepare(REF)
    assert not (tmp_path / "cdi").exists()
    assert driver.prepared() == {}


def test_failed_read_names_the_claim(tmp_path: Path, source: FakeClaims) -> None:
    source.failure = RuntimeError("connection refused")
    with pytest.raises(ClaimError, match=r"team/gpu-claim .* could not be read from the API server \(connection"):
        make_driver(tmp_path, source).prepare(REF)


def test_unwritable_cdi_dir_is_a_claim_error(tmp_path: Path, source: FakeClaims) -> None:
    (tmp_path / "cdi").write_text("a file where the directory should be")
    with pytest.raises(ClaimError, match="GPUSHARE_CDI_DIR"):
        make_driver(tmp_path, source).prepare(REF)


def test_corrupt_checkpoint_stops_the_start(tmp_path: Path, source: FakeClaims) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / FILE_NAME).write_text("{")
    with pytest.raises(CheckpointError, match="is corrupt"):
        make_driver(tmp_path, source)


OTHER_UID = "00000000-0000-4000-8000-000000000009"


def test_two_drivers_of_one_node_keep_each_others_claims(tmp_path: Path) -> None:
    """A rolling update: the old pod and the new one share the state directory, and the kubelet calls either."""
    other = claim(result("gpu-1", "2Gi", request="b"), uid=OTHER_UID)
    other["metadata"]["name"] = "other-claim"
    source = FakeClaims(claim(result("gpu-0", "4Gi", request="a")), other)
    old, new = make_driver(tmp_path, source), make_driver(tmp_path, source)
    old.prepare(REF)
    new.prepare(ClaimRef("team", "other-claim", OTHER_UID))
    assert set(Checkpoint(str(tmp_path / "state")).load()) == {UID, OTHER_UID}, "the new pod kept the old's claim"
    new.unprepare(REF)  # prepared by the old pod, unprepared by the new one
    assert set(Checkpoint(str(tmp_path / "state")).load()) == {OTHER_UID}
    assert set(old.prepared()) == {UID}, "in memory until the old pod's next write"


def test_the_checkpoint_is_changed_under_the_lock_file(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path))
    held: list[bool] = []

    def change(now: dict[str, PreparedClaim]) -> dict[str, PreparedClaim]:
        with open(checkpoint.lock_path, encoding="utf-8") as handle:  # another open file: another pod's flock
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(True)
        return now

    checkpoint.update(change)
    assert held == [True]
    with open(checkpoint.lock_path, encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released once the update is done

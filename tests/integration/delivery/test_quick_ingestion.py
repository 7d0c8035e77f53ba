"""A partner whose ingestion takes a file the moment the rename puts it in place, placed exactly: the
embedded server moves the file away inside its rename, before it answers. The standard mode's confirming
look then finds nothing, as paramiko's ``put(confirm=True)`` does (paramiko issues 1843, 149), and cannot
call it delivered; quick-ingest takes the rename's answer as the receipt."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from app.delivery.classifier import Completed, Unknown
from app.delivery.evidence import Evidence, EvidenceStage, Proof
from app.delivery.modes import DeliveryMode
from app.store.types import ExpectedFile
from tests.fixtures.sftp import SftpPeer


def _taking(peer: SftpPeer, taken: Path) -> None:
    assert peer.server is not None
    taken.mkdir()
    peer.server.on_rename = lambda path: os.rename(path, taken / Path(path).name)


def _export(tmp_path: Path) -> tuple[Path, ExpectedFile]:
    data = os.urandom(50_000)
    local = tmp_path / "built.csv"
    local.write_bytes(data)
    return local, ExpectedFile("contacts-quick.csv", len(data), hashlib.sha256(data).digest())


def test_a_file_taken_as_it_is_renamed_is_delivered_in_quick_ingest_and_unknown_in_standard(
        embedded_sftp: SftpPeer, tmp_path: Path) -> None:
    _taking(embedded_sftp, tmp_path / "taken")
    local, expected = _export(tmp_path)
    standard: list[Evidence] = []
    quick: list[Evidence] = []

    before = embedded_sftp.destination().deliver(local, expected, attempt_id="att-1", record_evidence=standard.append)
    (tmp_path / "taken" / expected.name).unlink()
    after = embedded_sftp.destination(delivery_mode=DeliveryMode.QUICK_INGEST).deliver(
        local, expected, attempt_id="att-2", record_evidence=quick.append)

    assert isinstance(before, Unknown) and "does not show the delivered file" in before.detail
    assert isinstance(after, Completed) and after.receipt.proof is Proof.RENAME_ACKNOWLEDGED
    assert [e.stage for e in quick] == [EvidenceStage.BASELINE, EvidenceStage.RENAMED, EvidenceStage.RECEIPT]
    assert quick[-1].listing.present is False   # the look found the name gone: the answer is the receipt
    assert (tmp_path / "taken" / expected.name).read_bytes() == local.read_bytes()
    assert embedded_sftp.files() == {}

"""The chaos checker, taught the delivery modes: an attempt is judged by the rules of the mode its cutoff 2
recorded (``mode-evidence``), and a partner whose ingestion took a delivered file still has it."""

from __future__ import annotations

import hashlib
import uuid

from app.delivery.classifier import Completed, outcome_evidence
from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.delivery.modes import DeliveryMode
from app.store import export
from app.store.types import ExpectedFile, Status
from exports_devtools.chaos.checker import check
from tests.integration.devtools.test_chaos_checker import REMOTE_DIR, WORKER, World

CONTENT = b"id,email\n9,i@example.com\n"
INGESTED = "ingested"


def _delivered(world: World, mode: DeliveryMode, *, proof: Proof, looks: tuple[EvidenceStage, ...] = (),
               where: str = "inbox"):
    """A job delivered in ``mode``: cutoff 2 recording it, the evidence given, its terminal write with a
    receipt of ``proof``, and its file where the partner has it."""
    job = world.seed.running()
    name = export.final_name(job.delivery_key)
    expected = ExpectedFile(name, len(CONTENT), hashlib.sha256(CONTENT).digest())
    baseline = Listing.not_looked(name) if not mode.looks else Listing(final_name=name, present=False)
    assert export.try_authorize_delivery(
        world.conn, job_id=job.id, tenant_id=job.tenant_id, attempt_id=job.attempt_id, expected=expected,
        replaces_job_id=None, evidence=[Evidence(EvidenceStage.BASELINE, baseline, str(job.attempt_id)).to_detail()],
        delivery_mode=mode.value) == 1
    seen = Listing(final_name=name, present=True, size=len(CONTENT), mtime=1)
    stage = EvidenceStage.RENAMED if proof is Proof.RENAME_ACKNOWLEDGED else EvidenceStage.RECEIPT
    receipt = Evidence(stage, seen, str(job.attempt_id))
    details = [Evidence(look, seen, str(job.attempt_id)).to_detail() for look in looks] + [receipt.to_detail()]
    details.append(outcome_evidence(Completed(Receipt(proof, False, receipt)), job.attempt_id))
    assert export.try_finish_delivery(world.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                      outcome=Status.COMPLETED, evidence=details) == 1
    (world.root / where).mkdir(exist_ok=True)
    (world.root / where / name).write_bytes(CONTENT)
    world.renames[f"/inbox/{name}"] = 1
    world.publish()
    return job


def _fired(world: World, *, ingested: tuple[str, ...] = ()) -> set[tuple[str, uuid.UUID | None]]:
    found = check(world.admin, partner_root=world.root, remote_dir=REMOTE_DIR, partner_renames=world.renames,
                  work_dirs=[world.work_dir], ledger=world.ledger, ingested_dirs=ingested)
    return {(v.rule, v.job_id) for v in found}


def test_deliveries_each_proven_as_its_mode_documents_break_no_rule(world: World) -> None:
    _delivered(world, DeliveryMode.STANDARD, proof=Proof.NAME_AND_SIZE)
    _delivered(world, DeliveryMode.NO_RENAME, proof=Proof.NAME_AND_SIZE)
    _delivered(world, DeliveryMode.NO_STAT, proof=Proof.RENAME_ACKNOWLEDGED)
    _delivered(world, DeliveryMode.QUICK_INGEST, proof=Proof.RENAME_ACKNOWLEDGED, looks=(EvidenceStage.RECEIPT,),
               where=INGESTED)

    assert _fired(world, ingested=(INGESTED,)) == set()


def test_a_completed_file_the_partners_ingestion_took_is_missing_unless_the_check_knows_where_it_went(
        world: World) -> None:
    job = _delivered(world, DeliveryMode.QUICK_INGEST, proof=Proof.RENAME_ACKNOWLEDGED, where=INGESTED)

    assert _fired(world) == {("completed-file-mismatch", job.id)}
    assert _fired(world, ingested=(INGESTED,)) == set()


def test_a_look_at_a_destination_whose_mode_allows_none_is_mode_evidence(world: World) -> None:
    job = _delivered(world, DeliveryMode.NO_STAT, proof=Proof.RENAME_ACKNOWLEDGED, looks=(EvidenceStage.INSPECTED,))

    assert _fired(world) == {("mode-evidence", job.id)}


def test_a_completed_on_the_renames_answer_where_a_look_is_the_receipt_is_mode_evidence(world: World) -> None:
    job = _delivered(world, DeliveryMode.STANDARD, proof=Proof.RENAME_ACKNOWLEDGED)

    assert _fired(world) == {("mode-evidence", job.id)}


def test_a_no_stat_delivery_completed_without_its_acknowledged_rename_is_mode_evidence(world: World) -> None:
    job = _delivered(world, DeliveryMode.NO_STAT, proof=Proof.CHECKSUM)

    assert ("mode-evidence", job.id) in _fired(world)

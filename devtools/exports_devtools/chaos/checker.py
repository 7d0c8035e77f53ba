"""The chaos soak's invariant checker: once the system has settled, what the database, the partner's
directory, the workers' local directories and the workload's ledger must show if nothing was lost,
delivered twice or delivered against an operator's cancel.

Each rule has a short stable name and yields at most one ``Violation`` per job, carrying the job's full
history (its row, events in order, outbox rows, cancellation requests and the partner's final file).
The rules, as ``docs/protocol.md`` states the promises:

- ``two-final-files``: a delivery key finalized more than once (the partner recorded more than one
  rename onto its final name, the name is in more than one destination's directory, or more than one
  of its jobs is Completed), with no overwrite agreement on any job of the key.
- ``file-after-cancel``: a Canceled, Stopped or Rejected job whose key has a final file that no
  Completed or OutcomeUnknown job of the key accounts for; or a job whose cancel was answered
  ``CanceledWhileQueued`` or ``StopRequested`` (in the ledger or recorded) that still passed cutoff 2
  or ended Completed.
- ``unaccounted-final-file``: a final file that no Completed or OutcomeUnknown job of its key accounts
  for, where no job of the key is Canceled, Stopped or Rejected (those are ``file-after-cancel``): an
  unexpected delivery, e.g. a Failed ``NotDelivered`` whose proof was wrong, or a key no job has.
- ``completed-file-mismatch``: a Completed job whose final file is missing or differs from the name,
  size and sha256 recorded at cutoff 2; unless a later replacement with an overwrite agreement passed
  cutoff 2 for the key (its file may rightly be there instead).
- ``unsettled-at-end``: a job still Queued, Running or Delivering; a Queued job is not one if an
  unpublished wake-up of it is due later (a deferral's backoff still running).
- ``event-mismatch``: replaying the job's events from Queued does not give its row (see
  ``TRANSITIONS``): a transition from a state it cannot leave that way, by an attempt that does not own
  the job, after a terminal state (a ``Reconciled`` of an OutcomeUnknown and a ``Corrected`` of a
  Completed or Failed are the recorded exceptions; ``DeliveryEvidence`` is not a transition and may be
  appended at any time, and so may cancellation requests), after the job was canceled; or a final status,
  attempt, failure code, ``attempt_count`` or ``deferrals`` the events do not account for. Queued ->
  Canceled is proven by its ``CanceledWhileQueued`` request (``cancellation_request_id``), Queued ->
  Rejected by nothing the schema records. ``attempt_count`` counts every claim, so it equals the number
  of ``Claimed`` events: a deferral does not give its claim back (recovery's cap counts
  ``attempt_count - deferrals`` instead), and ``deferrals`` equals the number of
  ``DeferredPartnerUnavailable`` events.
- ``resolved-without-evidence``: a job that left OutcomeUnknown (``Reconciled``), or that recovery
  resolved Completed from Delivering (``ResolvedByRecovery``), with no ``DeliveryEvidence`` of that
  attempt appended after its ``DeliveryAuthorized`` and before the resolution (the baseline listed
  before cutoff 2 says nothing of the upload); an operator's reconciliation (in the ledger) may instead
  cite evidence, which must not be blank in the ledger nor in the event.
- ``double-click-differs``: the same cancel request sent twice got two different outcomes.
- ``orphan-local-file``: a file left in a worker's local directory after the scavenger ran.
- ``outbox-not-drained``: an unpublished outbox row that is already due (rows due later are a
  deferral's wake-up, waiting for its time).
- ``slot-not-once``: a schedule's slot recorded without its one export, an export of a schedule that is
  not its slot's, two exports of one slot, or a cron slot never decided (``exports_devtools.chaos.slots``).
- ``mode-evidence``: an attempt judged against the rules of another delivery mode than the one its
  cutoff 2 recorded (``docs/protocol.md``, "Delivery modes"): a look at the destination (any evidence
  but the unlooked baseline, a refused rename's answer and the rename's acknowledgment) for an attempt in
  no-stat, which allows none; a Completed whose proof is the rename's answer in a mode where a look is
  the receipt (standard, no-rename); or a no-stat attempt Completed with no acknowledged rename of its
  own, unless a person reconciled or corrected it.
- ``webhook-mismatch`` and ``webhook-undelivered``: every outcome of a job of a tenant with a webhook
  endpoint told once, in order, and taken by the receiver (devtools/exports_devtools/chaos/webhooks.py).

A partner whose ingestion takes files away (``ingested_dirs``: where it puts them) still has them: a
key's files are looked for there too, and a Completed job's file is found there when its directory no
longer holds it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from app.delivery.evidence import EvidenceStage, Proof
from app.delivery.modes import DeliveryMode
from app.maintenance.scavenger import EXPORT_FILE
from app.store.types import CancellationOutcome, EventKind, Status
from exports_devtools.chaos import webhooks as webhook_rules
from exports_devtools.chaos.history import as_history, job_history
from exports_devtools.chaos.partner import Partner
from exports_devtools.chaos.record import Ledger, Violation
from exports_devtools.chaos.replay import TRANSITIONS, replay_problems, status_word
from exports_devtools.chaos.slots import slot_violations
from exports_devtools.store import chaos as store

# Re-exported: the soak (run.py) and the checker's tests import them from here.
__all__ = ["RULES", "TRANSITIONS", "check", "job_history", "replay_problems"]

Row = dict[str, Any]

RULES = ("two-final-files", "file-after-cancel", "unaccounted-final-file", "completed-file-mismatch",
         "unsettled-at-end", "event-mismatch", "resolved-without-evidence", "double-click-differs",
         "orphan-local-file", "outbox-not-drained", "slot-not-once", "mode-evidence", "webhook-mismatch",
         "webhook-undelivered")
#: What an attempt in a mode that allows no look may record without looking.
_NOT_LOOKS = frozenset({EvidenceStage.RENAMED.value, EvidenceStage.RENAME_REFUSED.value, "outcome"})

_LIVE = frozenset({Status.QUEUED, Status.RUNNING, Status.DELIVERING})
_ENDED_BY_OPERATOR = frozenset({Status.CANCELED, Status.STOPPED, Status.REJECTED})
_ACCOUNTS_FOR_FILE = frozenset({Status.COMPLETED, Status.OUTCOME_UNKNOWN})
_BEFORE_CUTOFF_2 = frozenset({CancellationOutcome.CANCELED_WHILE_QUEUED.value,
                              CancellationOutcome.STOP_REQUESTED.value})


# --- the rules ------------------------------------------------------------------------------------


@dataclass
class _Judge:
    snapshot: store.History
    partner: Partner
    default_dir: str
    #: Renames onto each final name, over every directory.
    renames: Mapping[str, int]
    work_dirs: Sequence[Path]
    ledger: Ledger
    #: The webhook ids the receiver took (answered 2xx, signature verified); None: not checked.
    webhooks_received: set[str] | None = None

    def __post_init__(self) -> None:
        self.jobs: dict[UUID, Row] = {j["id"]: j for j in self.snapshot.jobs}
        self.by_key: dict[str, list[Row]] = {}
        for job in self.snapshot.jobs:   # creation order
            self.by_key.setdefault(job["delivery_key"], []).append(job)
        self.found: dict[tuple[str, UUID | None], list[str]] = {}

    def flag(self, rule: str, job_id: UUID | None, detail: str) -> None:
        assert rule in RULES, rule
        self.found.setdefault((rule, job_id), []).append(detail)

    def events(self, job_id: UUID) -> list[Row]:
        return self.snapshot.events.get(job_id, [])

    def violations(self) -> list[Violation]:
        return [Violation(rule, job_id, "; ".join(details), history=self.history(job_id))
                for (rule, job_id), details in self.found.items()]

    def history(self, job_id: UUID | None) -> dict[str, Any]:
        if job_id is None:
            return {}
        return as_history(self.jobs.get(job_id), self.events(job_id), self.snapshot.outbox.get(job_id, []),
                        self.snapshot.cancellations.get(job_id, []), self.partner, self.default_dir)

    # 1, 2 and 3: the partner's files --------------------------------------------------------------

    def final_files(self) -> None:
        for key, jobs in self.by_key.items():
            name = jobs[0]["file_name"]   # kept with the key: every job of it delivers under this one name
            present = self.partner.files(name)
            renames = self.renames.get(name, 0)
            completed = [j for j in jobs if j["status"] == Status.COMPLETED]
            agreement = any(j["overwrite_agreement_ref"] for j in jobs)
            if not agreement and (renames > 1 or len(completed) > 1 or len(present) > 1):
                culprit = (completed or jobs)[-1]
                self.flag("two-final-files", culprit["id"],
                          f"key {key!r}: {renames} rename(s) onto {name}, files {[f.relative for f in present]}, "
                          f"Completed jobs {[str(j['id']) for j in completed]}, no overwrite agreement")
            if present and not any(j["status"] in _ACCOUNTS_FOR_FILE for j in jobs):
                where = ", ".join(f"{f.relative} (sha256 {f.sha256[:16]}...)" for f in present)
                ended = [j for j in jobs if j["status"] in _ENDED_BY_OPERATOR]
                for job in ended:
                    self.flag("file-after-cancel", job["id"],
                              f"{job['status']}, and {where} exists with no Completed or OutcomeUnknown job "
                              f"of key {key!r}")
                if not ended:
                    self.flag("unaccounted-final-file", jobs[-1]["id"],
                              f"{where} exists with no Completed or OutcomeUnknown job of key {key!r} "
                              f"(statuses {[j['status'] for j in jobs]})")
            for job in completed:
                self.completed_file(job, jobs)
        names = {jobs[0]["file_name"] for jobs in self.by_key.values()}
        names |= {job["expected_marker_name"] for jobs in self.by_key.values() for job in jobs
                  if job["expected_marker_name"] is not None}
        for relative in self.partner.final_names():
            if relative.rsplit("/", 1)[-1] not in names:
                self.flag("unaccounted-final-file", None, f"{relative} exists and no job delivers under its name")

    def completed_file(self, job: Row, jobs: list[Row]) -> None:
        overwritten = any(
            later["overwrite_agreement_ref"] and later["delivery_authorized_at"] is not None
            and later["created_at"] > job["created_at"] for later in jobs)
        if overwritten:
            return
        name = job["file_name"]
        directory = job["remote_dir"] or self.default_dir
        present = self.partner.file(directory, name) or self.partner.ingested(name)
        expected_name, size, sha = job["expected_file_name"], job["expected_file_bytes"], job["expected_file_sha256"]
        wrong = []
        if expected_name is None or size is None or sha is None:
            wrong.append("no expected file was recorded at cutoff 2")
        elif expected_name != name:
            wrong.append(f"expected name {expected_name!r} is not the key's final name")
        if present is None:
            wrong.append(f"{self.partner.relative(directory, name)} is missing")
        elif sha is not None and size is not None:
            if present.size != size:
                wrong.append(f"size {present.size} != expected {size}")
            if present.sha256 != bytes(sha).hex():
                wrong.append(f"sha256 {present.sha256[:16]}... != expected {bytes(sha).hex()[:16]}...")
        marker_name, marker = job["expected_marker_name"], job["expected_marker"]
        if marker_name is not None:
            # A partner that ingests on the marker has nothing until it is there, as recorded.
            found = self.partner.file(directory, marker_name) or self.partner.ingested(marker_name)
            if found is None:
                wrong.append(f"its completion marker {self.partner.relative(directory, marker_name)} is missing")
            elif marker is not None and found.sha256 != hashlib.sha256(bytes(marker)).hexdigest():
                wrong.append(f"its completion marker {marker_name} is not the one recorded at cutoff 2")
        if wrong:
            self.flag("completed-file-mismatch", job["id"], "Completed, but " + ", ".join(wrong))

    def cancels_before_cutoff_2(self) -> None:
        answered: dict[UUID, set[str]] = {}
        for answer in self.ledger.cancels:
            if answer.outcome in _BEFORE_CUTOFF_2:
                answered.setdefault(answer.job_id, set()).add(f"{answer.outcome} (ledger)")
        for job_id, requests in self.snapshot.cancellations.items():
            for request in requests:
                if request["outcome"] in _BEFORE_CUTOFF_2:
                    answered.setdefault(job_id, set()).add(f"{request['outcome']} (recorded)")
        for job_id, outcomes in answered.items():
            job = self.jobs.get(job_id)
            if job is None:
                continue
            authorized = any(e["kind"] == EventKind.DELIVERY_AUTHORIZED for e in self.events(job_id))
            if authorized or job["delivery_authorized_at"] is not None or job["status"] == Status.COMPLETED:
                self.flag("file-after-cancel", job_id,
                          f"cancel answered {sorted(outcomes)}, yet the job passed cutoff 2 "
                          f"(status {job['status']}, delivery_authorized_at {job['delivery_authorized_at']})")

    # 4 and 9: settled ------------------------------------------------------------------------------

    def settled(self) -> None:
        for job in self.snapshot.jobs:
            outbox = self.snapshot.outbox.get(job["id"], [])
            ahead = [o for o in outbox if o["ahead"]]
            status = job["status"]
            if status == Status.QUEUED and not ahead:
                newest = max((o["due_at"] or o["created_at"] for o in outbox), default=None)
                self.flag("unsettled-at-end", job["id"],
                          f"Queued (woken_at {job['woken_at']}, newest wake-up {newest}) with no wake-up due "
                          "later: a Queued job counts as settled only while a deferral's wake-up is ahead")
            elif status in (Status.RUNNING, Status.DELIVERING):
                self.flag("unsettled-at-end", job["id"],
                          f"{status} by {job['claimed_by']}, attempt {job['attempt_id']}, "
                          f"lease_expires_at {job['lease_expires_at']}")
            left = [o for o in outbox if o["published_at"] is None and not o["ahead"]]
            if left:
                self.flag("outbox-not-drained", job["id"],
                          f"{len(left)} unpublished outbox row(s) already due (oldest due "
                          f"{min(o['due_at'] or o['created_at'] for o in left)}), job {status}")
        for job_id, rows in self.snapshot.outbox.items():
            if job_id not in self.jobs and any(o["published_at"] is None and not o["ahead"] for o in rows):
                self.flag("outbox-not-drained", job_id, "unpublished outbox rows of a job that does not exist")

    # 5: events -------------------------------------------------------------------------------------

    def replay(self) -> None:
        for job in self.snapshot.jobs:
            problems = replay_problems(job, self.events(job["id"]), self.snapshot.cancellations.get(job["id"], []))
            if problems:
                self.flag("event-mismatch", job["id"], "; ".join(problems))

    # 6: evidence -----------------------------------------------------------------------------------

    def evidence(self) -> None:
        by_operator = {(r.job_id, r.attempt_id): r for r in self.ledger.reconciliations}
        for job in self.snapshot.jobs:
            events = self.events(job["id"])
            for event in events:
                kind, detail = event["kind"], event["detail"] or ""
                resolving = kind == EventKind.RECONCILED or (
                    kind == EventKind.RESOLVED_BY_RECOVERY and status_word(detail) is Status.COMPLETED)
                if not resolving:
                    continue
                # The attempt's baseline, listed before cutoff 2, says nothing of what the upload did: only
                # what was observed after its DeliveryAuthorized counts.
                authorized = next((e["id"] for e in events if e["kind"] == EventKind.DELIVERY_AUTHORIZED
                                   and e["attempt_id"] == event["attempt_id"]), 0)
                observed = any(e["kind"] == EventKind.DELIVERY_EVIDENCE and e["attempt_id"] == event["attempt_id"]
                               and authorized < e["id"] < event["id"] for e in events)
                if observed:
                    continue
                operator = by_operator.get((job["id"], event["attempt_id"])) if kind == EventKind.RECONCILED else None
                cited = detail.partition(":")[2].strip()
                if operator is not None and operator.evidence.strip() and cited:
                    continue
                who = "an operator" if operator else f"{event['observed_by']!r}"
                self.flag("resolved-without-evidence", job["id"],
                          f"{kind} ({detail!r}) by {who} for attempt {event['attempt_id']} with no DeliveryEvidence "
                          "between its cutoff 2 and this resolution"
                          + ("" if operator is None else " and no cited evidence"))

    # 11: the delivery mode's rules -----------------------------------------------------------------

    def mode_evidence(self) -> None:
        by_person = {(r.job_id, r.attempt_id) for r in self.ledger.reconciliations}
        for job in self.snapshot.jobs:
            if job["expected_delivery_mode"] is None or job["attempt_id"] is None:
                continue
            mode = DeliveryMode.of(job["expected_delivery_mode"])
            mine = [e for e in self.events(job["id"]) if e["attempt_id"] == job["attempt_id"]]
            records = [r for e in mine if e["kind"] == EventKind.DELIVERY_EVIDENCE
                       and (r := _record(e["detail"])) is not None]
            stages = {r.get("stage") for r in records}
            proofs = {(r.get("receipt") or {}).get("proof") for r in records if r.get("stage") == "outcome"}
            if not mode.looks:
                looked = sorted(str(r.get("stage")) for r in records
                                if r.get("stage") not in _NOT_LOOKS and r.get("observed") is not False)
                if looked:
                    self.flag("mode-evidence", job["id"], f"mode {mode.value} allows no look, yet {looked} looked")
            if Proof.RENAME_ACKNOWLEDGED.value in proofs and not mode.rename_answer_is_receipt:
                self.flag("mode-evidence", job["id"], f"Completed on the rename's answer in mode {mode.value}, "
                                                      "where only a look is a receipt")
            settled_by_person = (job["id"], job["attempt_id"]) in by_person or any(
                e["kind"] == EventKind.CORRECTED for e in mine)
            if job["status"] == Status.COMPLETED and not mode.looks and EvidenceStage.RENAMED.value not in stages \
                    and not settled_by_person:
                self.flag("mode-evidence", job["id"], f"Completed in mode {mode.value} with no acknowledged rename "
                                                      "of its own and no person's word")

    # 10: webhooks -----------------------------------------------------------------------------------

    def webhooks(self) -> None:
        for job in self.snapshot.jobs:
            found = webhook_rules.problems(job, self.events(job["id"]), self.snapshot.webhooks.get(job["id"], []),
                                           job["tenant_id"] in self.snapshot.notified_tenants,
                                           self.webhooks_received)
            for rule, detail in found.items():
                self.flag(rule, job["id"], detail)

    # 7 and 8 ---------------------------------------------------------------------------------------

    def double_clicks(self) -> None:
        for first, second in self.ledger.double_clicks:
            if first.outcome != second.outcome:
                self.flag("double-click-differs", first.job_id,
                          f"request {first.request_id} answered {first.outcome} then {second.outcome}")

    def local_files(self) -> None:
        for root in self.work_dirs:
            if not root.exists():
                continue
            for path in sorted(root.rglob("*")):
                if path.is_dir():
                    continue
                match = EXPORT_FILE.match(path.name)
                job_id = UUID(match["job"]) if match else None
                self.flag("orphan-local-file", job_id, f"{path} left after the scavenger ran")


# --- the check ------------------------------------------------------------------------------------


def check(conn: psycopg.Connection[Any], *, partner_root: Path, remote_dir: str, partner_renames: Mapping[str, int],
          work_dirs: Sequence[Path], ledger: Ledger, ingested_dirs: Sequence[str] = (),
          webhooks_received: set[str] | None = None) -> list[Violation]:
    """Every broken promise, once the system has settled and the scavenger has run. ``conn`` is an
    owner connection in autocommit mode with dict rows (``exports_devtools.store.owner.connect_owner``);
    ``partner_renames`` counts the partner's successful renames onto each final path (``"inbox/<name>"``,
    ``"/inbox/<name>"`` or the bare name: they are summed by final name, over every directory). A job's
    file is looked for in its destination's directory under ``partner_root`` (``remote_dir`` when the
    destination is unknown); a key's files in every destination's directory and ``remote_dir``. Files
    are judged by their final name, a function of the delivery key alone, so keys are taken to be
    unique across tenants. ``webhooks_received``: the ids the tenant's receiver took, when it is checked."""
    renames: dict[str, int] = {}
    for path, count in partner_renames.items():
        name = path.rsplit("/", 1)[-1]
        renames[name] = renames.get(name, 0) + count
    snapshot = store.read_history(conn)
    partner = Partner(partner_root, [remote_dir, *snapshot.remote_dirs], ingested=ingested_dirs)
    judge = _Judge(snapshot, partner, remote_dir, renames, work_dirs, ledger, webhooks_received)
    judge.final_files()
    judge.cancels_before_cutoff_2()
    judge.settled()
    judge.replay()
    judge.evidence()
    judge.double_clicks()
    judge.local_files()
    judge.mode_evidence()
    judge.webhooks()
    return judge.violations() + slot_violations(store.read_slots(conn))


def _record(detail: str | None) -> dict[str, Any] | None:
    """An evidence detail as the delivery and recovery write it (JSON); None for any other text."""
    try:
        payload = json.loads(detail or "")
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None

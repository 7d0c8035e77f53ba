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
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from app.devtools.chaos.record import Ledger, Violation
from app.maintenance.scavenger import EXPORT_FILE
from app.store import chaos as store
from app.store.export import final_name
from app.store.types import CancellationOutcome, EventKind, FailureCode, Status

Row = dict[str, Any]

RULES = ("two-final-files", "file-after-cancel", "unaccounted-final-file", "completed-file-mismatch",
         "unsettled-at-end", "event-mismatch", "resolved-without-evidence", "double-click-differs",
         "orphan-local-file", "outbox-not-drained")

#: Each transition event: the states it may leave, and the state it enters (None: named by its detail,
#: ``Finished``, ``ResolvedByRecovery``, ``Reconciled`` and ``Corrected``).
TRANSITIONS: Mapping[EventKind, tuple[frozenset[Status], Status | None]] = {
    EventKind.CLAIMED: (frozenset({Status.QUEUED}), Status.RUNNING),
    EventKind.DELIVERY_AUTHORIZED: (frozenset({Status.RUNNING}), Status.DELIVERING),
    EventKind.STOPPED: (frozenset({Status.RUNNING}), Status.STOPPED),
    EventKind.FAILED: (frozenset({Status.RUNNING}), Status.FAILED),
    EventKind.DEFERRED_PARTNER_UNAVAILABLE: (frozenset({Status.RUNNING}), Status.QUEUED),
    EventKind.FINISHED: (frozenset({Status.DELIVERING}), None),
    EventKind.REQUEUED_BY_RECOVERY: (frozenset({Status.RUNNING}), Status.QUEUED),
    EventKind.STOPPED_BY_RECOVERY: (frozenset({Status.RUNNING}), Status.STOPPED),
    EventKind.ATTEMPTS_EXHAUSTED: (frozenset({Status.RUNNING}), Status.FAILED),
    EventKind.RESOLVED_BY_RECOVERY: (frozenset({Status.DELIVERING}), None),
    EventKind.RECONCILED: (frozenset({Status.OUTCOME_UNKNOWN}), None),
    EventKind.CORRECTED: (frozenset({Status.COMPLETED, Status.FAILED}), None),
}

#: The states each detail-named transition may enter, as its statement allows.
_DETAIL_TARGETS: Mapping[EventKind, frozenset[Status]] = {
    EventKind.FINISHED: frozenset({Status.COMPLETED, Status.FAILED, Status.OUTCOME_UNKNOWN}),
    EventKind.RESOLVED_BY_RECOVERY: frozenset({Status.COMPLETED, Status.OUTCOME_UNKNOWN}),
    EventKind.RECONCILED: frozenset({Status.COMPLETED, Status.FAILED}),
    EventKind.CORRECTED: frozenset({Status.COMPLETED, Status.FAILED}),
}

_LIVE = frozenset({Status.QUEUED, Status.RUNNING, Status.DELIVERING})
_ENDED_BY_OPERATOR = frozenset({Status.CANCELED, Status.STOPPED, Status.REJECTED})
_ACCOUNTS_FOR_FILE = frozenset({Status.COMPLETED, Status.OUTCOME_UNKNOWN})
_BEFORE_CUTOFF_2 = frozenset({CancellationOutcome.CANCELED_WHILE_QUEUED.value,
                              CancellationOutcome.STOP_REQUESTED.value})
_FINAL_FILE = re.compile(r"^contacts-(?P<key>.+)\.csv$")
_STATUS_WORD = re.compile(r"^(?P<status>[A-Za-z]+)")
_CORRECTION = re.compile(r"^(?P<recorded>[A-Za-z]+) to (?P<corrected>[A-Za-z]+):")


# --- the partner's directory ----------------------------------------------------------------------


@dataclass(frozen=True)
class PartnerFile:
    relative: str          # to the partner's root: "inbox/<final name>"
    size: int
    sha256: str

    def as_json(self) -> dict[str, Any]:
        return {"path": self.relative, "size": self.size, "sha256": self.sha256}


class _Partner:
    """The partner's final files in each destination's directory, hashed once each."""

    def __init__(self, root: Path, directories: Iterable[str | None]):
        self.root = root
        self.directories = sorted({d.strip("/") for d in directories if d is not None})
        self._files: dict[str, PartnerFile | None] = {}

    @staticmethod
    def relative(directory: str | None, name: str) -> str:
        directory = (directory or "").strip("/")
        return f"{directory}/{name}" if directory else name

    def file(self, directory: str | None, name: str) -> PartnerFile | None:
        relative = self.relative(directory, name)
        if relative not in self._files:
            self._files[relative] = _read_file(self.root / relative, relative)
        return self._files[relative]

    def files(self, name: str) -> list[PartnerFile]:
        """The files under this final name, in every directory."""
        return [f for d in self.directories if (f := self.file(d, name)) is not None]

    def final_names(self) -> list[str]:
        """The relative paths of the final files there now; dot-files (uploads under their temporary
        names) and acknowledgments are not."""
        found = []
        for directory in self.directories:
            path = self.root / directory
            if path.is_dir():
                found += [self.relative(directory, p.name) for p in path.iterdir()
                          if _FINAL_FILE.match(p.name) and p.is_file()]
        return sorted(found)


def _read_file(path: Path, relative: str) -> PartnerFile | None:
    digest = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    return PartnerFile(relative, size, digest.hexdigest())


# --- histories ------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, Decimal):
        return float(value)
    return value


def _history(row: Row | None, events: Sequence[Row], outbox: Sequence[Row], cancellations: Sequence[Row],
             partner: _Partner, default_dir: str) -> dict[str, Any]:
    own = elsewhere = None
    if row is not None:
        name = final_name(row["delivery_key"])
        own = partner.file(row["remote_dir"] or default_dir, name)
        elsewhere = [f.as_json() for f in partner.files(name) if f != own]
    return _jsonable({"row": row, "events": list(events), "outbox": list(outbox),
                      "cancellations": list(cancellations),
                      "partner_file": own.as_json() if own else None, "partner_files_elsewhere": elsewhere or []})


def job_history(conn: psycopg.Connection[Any], job_id: UUID, partner_root: Path, remote_dir: str) -> dict[str, Any]:
    """One job's history, ready for JSON: ``row`` (None if no such job; with its destination's
    ``remote_dir``), ``events`` in order, ``outbox`` rows, ``cancellations`` (its requests),
    ``partner_file`` (``path``, ``size``, ``sha256`` of its key's final file in its destination's
    directory, or None) and ``partner_files_elsewhere`` (the same name in ``remote_dir``, if that is
    another directory)."""
    row, events, outbox, cancellations = store.job_rows(conn, job_id)
    partner = _Partner(partner_root, [remote_dir, row["remote_dir"] if row else None])
    return _history(row, events, outbox, cancellations, partner, remote_dir)


# --- the rules ------------------------------------------------------------------------------------


@dataclass
class _Judge:
    snapshot: store.History
    partner: _Partner
    default_dir: str
    #: Renames onto each final name, over every directory.
    renames: Mapping[str, int]
    work_dirs: Sequence[Path]
    ledger: Ledger

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
        return _history(self.jobs.get(job_id), self.events(job_id), self.snapshot.outbox.get(job_id, []),
                        self.snapshot.cancellations.get(job_id, []), self.partner, self.default_dir)

    # 1, 2 and 3: the partner's files --------------------------------------------------------------

    def final_files(self) -> None:
        for key, jobs in self.by_key.items():
            name = final_name(key)
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
        for relative in self.partner.final_names():
            match = _FINAL_FILE.match(relative.rsplit("/", 1)[-1])
            if match and match["key"] not in self.by_key:
                self.flag("unaccounted-final-file", None, f"{relative} exists and no job has key {match['key']!r}")

    def completed_file(self, job: Row, jobs: list[Row]) -> None:
        overwritten = any(
            later["overwrite_agreement_ref"] and later["delivery_authorized_at"] is not None
            and later["created_at"] > job["created_at"] for later in jobs)
        if overwritten:
            return
        name = final_name(job["delivery_key"])
        directory = job["remote_dir"] or self.default_dir
        present = self.partner.file(directory, name)
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
                    kind == EventKind.RESOLVED_BY_RECOVERY and _status_word(detail) is Status.COMPLETED)
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


def _status_word(detail: str) -> Status | None:
    match = _STATUS_WORD.match(detail)
    try:
        return Status(match["status"]) if match else None
    except ValueError:
        return None


def _entered(kind: EventKind, detail: str) -> Status | None:
    """The state a detail-named transition entered, or None if its detail does not name one it may."""
    if kind is EventKind.CORRECTED:
        match = _CORRECTION.match(detail)
        entered = _status_word(match["corrected"]) if match else None
    else:
        entered = _status_word(detail)
    return entered if entered in _DETAIL_TARGETS[kind] else None


def _failure_code(kind: EventKind, detail: str) -> str | None:
    """The failure code the event records for a Failed it entered; None when its detail does not say
    (a correction to Failed names no code in its detail)."""
    words = detail.replace(":", " ").split()
    if kind is EventKind.FAILED and words:
        return words[0]
    if kind is EventKind.FINISHED and len(words) > 1:
        return words[1]
    if kind is EventKind.ATTEMPTS_EXHAUSTED:
        return FailureCode.ATTEMPTS_EXHAUSTED.value
    if kind is EventKind.RECONCILED:
        return FailureCode.NOT_DELIVERED.value
    return None


def replay_problems(job: Row, events: Sequence[Row], cancellations: Iterable[Row]) -> list[str]:
    """Replays ``events`` (one job's, in order) from Queued and says where they and the row disagree."""
    problems: list[str] = []
    cancel = next((c for c in cancellations if c["id"] == job["cancellation_request_id"]), None)
    canceled_at = cancel["recorded_at"] if cancel is not None and job["status"] == Status.CANCELED else None
    status, attempt, code = Status.QUEUED, None, None
    claims = deferrals = 0
    for event in events:
        try:
            kind = EventKind(event["kind"])
        except ValueError:
            problems.append(f"event {event['id']}: unknown kind {event['kind']!r}")
            continue
        if kind is EventKind.DELIVERY_EVIDENCE:
            continue
        where = f"event {event['id']} {kind.value}"
        if canceled_at is not None and event["recorded_at"] > canceled_at:
            problems.append(f"{where} after the job was canceled at {canceled_at}")
        leaves, enters = TRANSITIONS[kind]
        detail = event["detail"] or ""
        if status not in leaves:
            after = "follows the terminal state" if status.is_terminal else "from"
            problems.append(f"{where} {after} {status.value}")
        if kind is EventKind.CLAIMED:
            attempt = event["attempt_id"]
            claims += 1
        elif event["attempt_id"] != attempt:
            problems.append(f"{where} by attempt {event['attempt_id']}, but the job's attempt is {attempt}")
        target = enters if enters is not None else _entered(kind, detail)
        if target is None:
            problems.append(f"{where} names no state it may enter ({detail!r})")
            continue
        if target is Status.FAILED:
            code = _failure_code(kind, detail)
        status = target
        if kind is EventKind.DEFERRED_PARTNER_UNAVAILABLE:
            deferrals += 1
        if status is Status.QUEUED:
            attempt = None   # a requeue and a deferral clear the attempt; terminal states keep it
    recorded = Status(job["status"])
    if recorded is Status.CANCELED:
        if cancel is None or cancel["outcome"] != CancellationOutcome.CANCELED_WHILE_QUEUED:
            problems.append("Canceled without its CanceledWhileQueued request "
                            f"(cancellation_request_id {job['cancellation_request_id']})")
    if recorded in (Status.CANCELED, Status.REJECTED):
        if status is not Status.QUEUED:
            problems.append(f"row {recorded.value}, but the events leave it {status.value}, not Queued")
    elif recorded is not status:
        problems.append(f"row {recorded.value}, but the events leave it {status.value}")
    if job["attempt_id"] != attempt and recorded is status:
        problems.append(f"row attempt {job['attempt_id']}, but the events leave attempt {attempt}")
    if job["attempt_count"] != claims:
        problems.append(f"attempt_count {job['attempt_count']}, but {claims} Claimed event(s)")
    if job["deferrals"] != deferrals:
        problems.append(f"deferrals {job['deferrals']}, but {deferrals} DeferredPartnerUnavailable event(s)")
    if recorded is Status.FAILED and status is Status.FAILED and code is not None and job["failure_reason"] != code:
        problems.append(f"failure_reason {job['failure_reason']}, but the events record {code}")
    if recorded is Status.STOPPED and job["stop_request_id"] is None:
        problems.append("Stopped with no stop request recorded")
    return problems


# --- the check ------------------------------------------------------------------------------------


def check(conn: psycopg.Connection[Any], *, partner_root: Path, remote_dir: str, partner_renames: Mapping[str, int],
          work_dirs: Sequence[Path], ledger: Ledger) -> list[Violation]:
    """Every broken promise, once the system has settled and the scavenger has run. ``conn`` is an
    owner connection in autocommit mode with dict rows (``app.store.devtools.connect_owner``);
    ``partner_renames`` counts the partner's successful renames onto each final path (``"inbox/<name>"``,
    ``"/inbox/<name>"`` or the bare name: they are summed by final name, over every directory). A job's
    file is looked for in its destination's directory under ``partner_root`` (``remote_dir`` when the
    destination is unknown); a key's files in every destination's directory and ``remote_dir``. Files
    are judged by their final name, a function of the delivery key alone, so keys are taken to be
    unique across tenants."""
    renames: dict[str, int] = {}
    for path, count in partner_renames.items():
        name = path.rsplit("/", 1)[-1]
        renames[name] = renames.get(name, 0) + count
    snapshot = store.read_history(conn)
    partner = _Partner(partner_root, [remote_dir, *snapshot.remote_dirs])
    judge = _Judge(snapshot, partner, remote_dir, renames, work_dirs, ledger)
    judge.final_files()
    judge.cancels_before_cutoff_2()
    judge.settled()
    judge.replay()
    judge.evidence()
    judge.double_clicks()
    judge.local_files()
    return judge.violations()

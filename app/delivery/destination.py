"""Delivering one file to a partner's SFTP destination, in two parts either side of cutoff 2, and
looking at what a final name holds.

Delivery follows the reference's rules for an upload that is safe to interrupt:

- ``prepare`` runs while the job is still Running, where everything is reversible: it opens the
  session (within the destination's session slots, warm if the worker keeps one), lists the final
  name and hands the listing to ``record_evidence`` as the attempt's baseline before anything is
  uploaded, and decides. A partner that cannot be reached answers ``Unreachable`` with the cause
  (transient: the attempt defers; configuration: it fails), and nothing was sent.
- An occupied final name is never overwritten by default. An original stops with
  FinalNameOccupied; a replacement stops with OriginalDelivered when the file there is identified as
  the original's delivery, FinalNameOccupied when it cannot be identified, and overwrites only with
  the partner's recorded agreement. Both answer ``Refused`` from ``prepare``, before cutoff 2.
- Otherwise ``prepare`` answers ``Ready`` (``app.delivery.upload``), whose ``complete``, after
  cutoff 2, uploads under a temporary name, renames without overwriting and confirms from evidence.

The destination's delivery mode (``app.delivery.modes``) changes what may be done: in mode no-stat
nothing is looked at, so the baseline records that nothing could be seen, nothing already there can be
identified (so nothing is overwritten, whatever was agreed), and the no-overwrite rename is the guard;
in mode no-rename the baseline also looks at the completion marker's name, an overwrite is never made,
and ``prepare`` answers ``InPlace`` (``app.delivery.in_place``).

``deliver`` runs both parts back to back, for callers with no cutoff between them. Sessions come from
``app.delivery.sessions``, observations from ``app.delivery.listing``, the evidence types from
``app.delivery.evidence``; the credential is resolved (``app.delivery.credentials``) only when
connecting and never logged.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app import logs
from app.delivery import listing, markers, preflight
from app.delivery.classifier import DeliveryOutcome, Failed, Stage, cause_of, classify, describe, is_status_reply
from app.delivery.config import DestinationConfig
from app.delivery.credentials import Credential, CredentialCache, resolve_credential
from app.delivery.errors import CredentialError, EvidenceNotRecorded, SessionLimitReached
from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof
from app.delivery.in_place import InPlace
from app.delivery.modes import DeliveryMode
from app.delivery.session import Session, connect
from app.delivery.sessions import FreshSessions, SessionSource
from app.delivery.upload import Ready, RecordEvidence
from app.store.types import ExpectedFile, FailureCause, FailureCode

log = logs.get(__name__)


@dataclass(frozen=True)
class Unreachable:
    """``prepare`` could not reach the partner; nothing was sent. A transient cause defers the attempt,
    any other fails it."""

    cause: FailureCause
    #: Secret-free: what failed, for the deferral's event and the circuit's last error.
    detail: str
    #: No session slot was free: the partner was not even tried, and its circuit learns nothing.
    session_limit: bool = False


@dataclass(frozen=True)
class Refused:
    """The baseline showed the final name taken (FinalNameOccupied, OriginalDelivered): nothing to upload."""

    outcome: Failed
    baseline: Listing


class Destination:
    """A partner's SFTP destination. Thread-safe: each delivery holds a session of its own."""

    def __init__(self, config: DestinationConfig, *, environ: Mapping[str, str] | None = None,
                 credentials: CredentialCache | None = None) -> None:
        self.config = config
        self._environ = environ if environ is not None else os.environ
        self._credentials = credentials
        self._pinned = config.pinned_keys()

    def __repr__(self) -> str:
        return f"Destination({self.config!r})"

    def _credential(self) -> Credential:
        if self._credentials is not None:
            return self._credentials.resolve(self.config.credential_ref, self._environ)
        return resolve_credential(self.config.credential_ref, self._environ)

    # -- observation ----------------------------------------------------------------------------

    def inspect(self, final_name: str, *, with_hash: bool = True, marker_name: str | None = None) -> Listing:
        """What the destination shows now under a final name (for recovery and reconciliation).

        Raises the connection's error if the destination cannot be reached; callers treat that as
        "no evidence", never as absence. Not for a mode that allows no look (a programming error).
        """
        if not self.config.delivery_mode.looks:
            raise ValueError(f"mode {self.config.delivery_mode.value} allows no look at the destination")
        with connect(self.config, self._pinned, self._credential()) as session:
            return listing.list_final(session, self.config, final_name, with_hash=with_hash, marker_name=marker_name)

    def log_in(self) -> Unreachable | None:
        """Resolves the credential and logs in as a delivery does (the pinned host keys), then logs out:
        None when it logged in, else why not, its cause saying who is at fault: configuration (the key is
        not pinned, the login was refused) or the connection (transient). Raises CredentialError when the
        reference does not resolve here: nothing was sent."""
        credential = self._credential()
        try:
            with connect(self.config, self._pinned, credential):
                return None
        except Exception as exc:
            return Unreachable(cause_of(exc), describe(exc, redact=credential.redactions()))

    def check(self, *, ingestion_window: float | None = None) -> preflight.Capabilities:
        """What the server allows (``exports destination check``), on a session opened as a delivery's, and
        with ``ingestion_window`` whether the partner's ingestion takes a published file. Raises the
        connection's error (a host key not pinned, a refused credential, no answer)."""
        credential = self._credential()
        with connect(self.config, self._pinned, credential) as session:
            found = preflight.check(session, self.config, ingestion_window=ingestion_window)
            preflight.sessions(found, lambda: connect(self.config, self._pinned, credential),
                               self.config.max_sessions, redactions=credential.redactions())
            return found

    def complete_marker(self, expected: ExpectedFile, attempt_id: str) -> Listing:
        """For recovery and reconciliation: the completion marker written where the file is there as
        recorded and its marker is not (``app.delivery.markers.complete``), and what the destination shows
        then. Raises the connection's error, like ``inspect``."""
        with connect(self.config, self._pinned, self._credential()) as session:
            return markers.complete(session, self.config, expected, attempt_id)

    # -- before cutoff 2 ------------------------------------------------------------------------

    def probe(self, *, sessions: SessionSource | None = None) -> Unreachable | None:
        """Whether the partner can be reached now: opens a session and gives it back (kept warm where the
        pool keeps one, for the delivery that follows). None when it connected."""
        source = sessions or FreshSessions()
        try:
            credential = self._credential()
        except CredentialError as exc:
            return Unreachable(FailureCause.CONFIGURATION, describe(exc))
        try:
            held = source.open(self.config, self._pinned, credential)
        except SessionLimitReached as exc:
            return Unreachable(FailureCause.TRANSIENT, describe(exc), session_limit=True)
        except Exception as exc:
            return Unreachable(cause_of(exc), f"connecting: {describe(exc, redact=credential.redactions())}")
        source.give_back(held, reusable=True)
        return None

    def prepare(self, expected: ExpectedFile, *, attempt_id: str, replacement: bool = False,
                replacement_of: ExpectedFile | None = None, overwrite_agreed: bool = False,
                record_evidence: RecordEvidence, sessions: SessionSource | None = None) -> Preparation:
        """Opens a session, records the baseline and decides; never uploads.

        ``replacement`` says the job replaces an original, whose expected file (``replacement_of``) is
        known only if the original reached cutoff 2. ``record_evidence`` is called with the baseline;
        if it raises, ``EvidenceNotRecorded`` is raised and nothing may be uploaded. A BaseException
        (shutdown) propagates, with the session closed.
        """
        final = expected.name
        mode = self.config.delivery_mode
        # Programming errors, raised before anything is sent rather than classified.
        self.config.remote_path(final)
        self.config.remote_path(listing.temp_name(final, attempt_id))
        if mode.needs_marker and expected.marker_name is None:
            raise ValueError(f"mode {mode.value} publishes by the completion marker, and the file has none")
        source = sessions or FreshSessions()
        fields = {"attempt_id": attempt_id, "final_name": final}
        try:
            credential = self._credential()
        except CredentialError as exc:
            return Unreachable(FailureCause.CONFIGURATION, describe(exc))
        redact = credential.redactions()
        retried = False
        while True:
            try:
                held = source.open(self.config, self._pinned, credential)
            except SessionLimitReached as exc:
                return Unreachable(FailureCause.TRANSIENT, describe(exc), session_limit=True)
            except Exception as exc:
                log.warning("delivery.unreachable", **fields, error=describe(exc, redact=redact))
                return Unreachable(cause_of(exc), f"connecting: {describe(exc, redact=redact)}")
            try:
                baseline = self._baseline(held.session, expected)
                break
            except Exception as exc:
                source.give_back(held, reusable=False)
                if held.reused and not retried:
                    # A warm session that died after its check says nothing about the partner: a new one.
                    retried = True
                    continue
                log.warning("delivery.unreachable", **fields, error=describe(exc, redact=redact))
                return Unreachable(cause_of(exc), f"listing the final name: {describe(exc, redact=redact)}")
            except BaseException:
                source.give_back(held, reusable=False)
                raise
        try:
            # Recorded before anything is uploaded: if it cannot be recorded, nothing is.
            record_evidence(Evidence(EvidenceStage.BASELINE, baseline, attempt_id))
        except BaseException as exc:
            source.give_back(held, reusable=True)
            if not isinstance(exc, Exception):
                raise
            raise EvidenceNotRecorded(f"the baseline was not recorded: {describe(exc)}") from exc
        # At INFO only when a file is there already, which decides what follows; an empty baseline is
        # every ordinary delivery, and the runner's lines say the rest (its session's reuse included).
        (log.info if baseline.present else log.debug)(
            "delivery.baseline", **fields, present=baseline.present, size=baseline.size, reused=held.reused)
        decision = self._decide(baseline, replacement or replacement_of is not None, replacement_of,
                                overwrite_agreed, expected)
        if isinstance(decision, Failed):
            source.give_back(held, reusable=True)
            log.info("delivery.refused", **fields, code=decision.code.value)
            return Refused(decision, baseline)
        kind = InPlace if mode is DeliveryMode.NO_RENAME else Ready
        return kind(self.config, self._pinned, source, held, credential, expected, attempt_id, baseline, decision,
                    record_evidence)

    def deliver(self, local_path: Path | str, expected: ExpectedFile, *, attempt_id: str, replacement: bool = False,
                replacement_of: ExpectedFile | None = None, overwrite_agreed: bool = False,
                record_evidence: RecordEvidence, sessions: SessionSource | None = None) -> DeliveryOutcome:
        """``prepare`` and ``Ready.complete`` back to back; never raises for an ordinary error. What
        stopped it before the upload is a Failed (NotDelivered) with its cause: nothing was sent.
        A BaseException (shutdown, time limit) propagates unchanged; the caller classifies it with
        ``classify(exc, stage=Stage.UNKNOWN)``, which is always OutcomeUnknown."""
        try:
            prepared = self.prepare(expected, attempt_id=attempt_id, replacement=replacement,
                                    replacement_of=replacement_of, overwrite_agreed=overwrite_agreed,
                                    record_evidence=record_evidence, sessions=sessions)
        except EvidenceNotRecorded as exc:
            return classify(exc, stage=Stage.BASELINE)
        match prepared:
            case Ready():
                return prepared.complete(local_path)
            case Refused(outcome=outcome):
                return outcome
            case Unreachable(cause=cause, detail=detail):
                return Failed(FailureCode.NOT_DELIVERED, f"no write was sent (connect): {detail}", cause)
        raise AssertionError(f"unexpected preparation {prepared!r}")

    def _baseline(self, session: Session, expected: ExpectedFile) -> Listing:
        """The look before the upload: the final name (with its marker's name in mode no-rename, where the
        marker is what publishes); in mode no-stat, a request that proves the session alive and a
        record that nothing could be seen."""
        mode = self.config.delivery_mode
        if not mode.looks:
            _alive(session)
            return Listing.not_looked(expected.name)
        marker_name = expected.marker_name if mode is DeliveryMode.NO_RENAME else None
        return listing.list_final(session, self.config, expected.name, with_hash=True, marker_name=marker_name)

    def _decide(
        self, baseline: Listing, replacement: bool, replacement_of: ExpectedFile | None, overwrite_agreed: bool,
        expected: ExpectedFile,
    ) -> bool | Failed:
        """False: upload without overwriting; True: overwrite by agreement; or Failed."""
        mode = self.config.delivery_mode
        if not baseline.observed:
            # Nothing can be identified, so nothing is overwritten: the no-overwrite rename guards the name.
            return False
        if mode is DeliveryMode.NO_RENAME and baseline.marker is not None and not baseline.occupied:
            return Failed(FailureCode.FINAL_NAME_OCCUPIED, f"the completion marker's name {expected.marker_name} "
                                                           "already exists; uploaded nothing")
        if not baseline.occupied:
            return False
        if not replacement:
            # An original's name is unique to a delivery key nothing has published yet.
            return Failed(FailureCode.FINAL_NAME_OCCUPIED, "the final name already exists; uploaded nothing")
        # An original that never reached cutoff 2 recorded no expected file: nothing can identify
        # the file as its delivery, so only an agreed overwrite may replace it.
        proof = baseline.proof_for(replacement_of) if replacement_of is not None else Proof.NONE
        if proof.strong or (proof is Proof.NAME_AND_SIZE and self.config.name_and_size_identify):
            return Failed(FailureCode.ORIGINAL_DELIVERED, f"the final name holds the original's delivery "
                                                          f"(identified by {proof.value}); uploaded nothing")
        if overwrite_agreed and mode.renames:
            return True
        if overwrite_agreed:
            return Failed(FailureCode.FINAL_NAME_OCCUPIED, f"the final name holds a file; mode {mode.value} never "
                                                           "overwrites (it cannot rename over it); uploaded nothing")
        return Failed(FailureCode.FINAL_NAME_OCCUPIED, "the final name holds a file not identified as the original's "
                                                       "and no overwrite is agreed; uploaded nothing")


def _alive(session: Session) -> None:
    """One round trip that needs no look (REALPATH of the working directory): a warm session that died
    raises here, before anything is uploaded. A refusal is an answer, so the session is alive."""
    try:
        session.sftp.normalize(".")
    except OSError as exc:
        if not is_status_reply(exc):
            raise


#: What ``prepare`` answers: ready to deliver after cutoff 2, refused by the baseline, or unreachable.
Preparation = Ready | Refused | Unreachable

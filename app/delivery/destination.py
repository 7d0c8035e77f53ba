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
- After cutoff 2, ``Ready.complete`` writes the file on the same session under a temporary name in
  the remote directory, ``.<final>.<attempt_id>.part``: a leading dot and a ``.part`` suffix, which
  the partner agrees to ignore, and the attempt id so two attempts never share one. Only a complete,
  verified upload is renamed to the final name.
- The rename is SSH_FXP_RENAME, which on OpenSSH and ProFTPD refuses an existing target, so a file
  that lands between the listing and the rename is never replaced. ``posix-rename@openssh.com``,
  which replaces, is used only for a replacement with an overwrite agreement that found a file.
- Completed needs evidence read back after the rename: name and size changed from an absent
  baseline (the partner publishes by atomic rename), stronger with a checksum (``check-file-name``
  sha256, or a read-back where the contract allows) or the partner's acknowledgment file. An
  overwrite needs the stronger evidence. Anything that stops the delivery part way goes through the
  classifier, which answers Failed only on proof that the final name was never written.

``deliver`` runs both parts back to back, for callers with no cutoff between them. Sessions come from
``app.delivery.sessions``, observations from ``app.delivery.listing``, the evidence types from
``app.delivery.evidence``; the credential is resolved (``app.delivery.credentials``) only when
connecting and never logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.delivery import listing
from app.delivery.classifier import (
    Completed,
    DeliveryOutcome,
    Failed,
    Stage,
    Unknown,
    cause_of,
    classify,
    describe,
    is_status_reply,
)
from app.delivery.config import DestinationConfig
from app.delivery.credentials import Credential, resolve_credential
from app.delivery.errors import CredentialError, EvidenceNotRecorded, SessionLimitReached, UploadMismatch
from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.delivery.session import CHUNK_SIZE, Session, connect
from app.delivery.sessions import FreshSessions, HeldSession, SessionSource
from app.store.types import ExpectedFile, FailureCause, FailureCode

log = logging.getLogger(__name__)

#: Called with every observation a delivery makes, to append it to the attempt's evidence.
RecordEvidence = Callable[[Evidence], None]


def temp_name(final_name: str, attempt_id: str) -> str:
    """The temporary name an attempt uploads under; the partner ignores dot-files ending in .part."""
    return f".{final_name}.{attempt_id}.part"


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

    def __init__(self, config: DestinationConfig, *, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._environ = environ if environ is not None else os.environ
        self._pinned = config.pinned_key()

    def __repr__(self) -> str:
        return f"Destination({self.config!r})"

    def _credential(self) -> Credential:
        return resolve_credential(self.config.credential_ref, self._environ)

    # -- observation ----------------------------------------------------------------------------

    def inspect(self, final_name: str, *, with_hash: bool = True) -> Listing:
        """What the destination shows now under a final name (for recovery and reconciliation).

        Raises the connection's error if the destination cannot be reached; callers treat that as
        "no evidence", never as absence.
        """
        with connect(self.config, self._pinned, self._credential()) as session:
            return listing.list_final(session, self.config, final_name, with_hash=with_hash)

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
        # Programming errors, raised before anything is sent rather than classified.
        self.config.remote_path(final)
        self.config.remote_path(temp_name(final, attempt_id))
        source = sessions or FreshSessions()
        fields = f"attempt_id={attempt_id} final_name={final}"
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
                log.warning("delivery.unreachable %s error=%s", fields, describe(exc, redact=redact))
                return Unreachable(cause_of(exc), f"connecting: {describe(exc, redact=redact)}")
            try:
                baseline = listing.list_final(held.session, self.config, final, with_hash=True)
                break
            except Exception as exc:
                source.give_back(held, reusable=False)
                if held.reused and not retried:
                    # A warm session that died after its check says nothing about the partner: a new one.
                    retried = True
                    continue
                log.warning("delivery.unreachable %s error=%s", fields, describe(exc, redact=redact))
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
        log.info("delivery.baseline %s present=%s size=%s reused=%s", fields, baseline.present, baseline.size,
                 held.reused)
        decision = self._decide(baseline, replacement or replacement_of is not None, replacement_of,
                                overwrite_agreed)
        if isinstance(decision, Failed):
            source.give_back(held, reusable=True)
            log.info("delivery.refused %s code=%s", fields, decision.code.value)
            return Refused(decision, baseline)
        return Ready(self, source, held, credential, expected, attempt_id, baseline, decision, record_evidence)

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

    def _decide(
        self, baseline: Listing, replacement: bool, replacement_of: ExpectedFile | None, overwrite_agreed: bool
    ) -> bool | Failed:
        """False: upload with the no-overwrite rename; True: overwrite by agreement; or Failed."""
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
        if overwrite_agreed:
            return True
        return Failed(FailureCode.FINAL_NAME_OCCUPIED, "the final name holds a file not identified as the original's "
                                                       "and no overwrite is agreed; uploaded nothing")

    # -- after cutoff 2 -------------------------------------------------------------------------

    def _upload(self, session: Session, local_path: Path, temp: str, expected: ExpectedFile) -> None:
        remote = self.config.remote_path(temp)
        digest = hashlib.sha256()
        size = 0
        # "x": an exclusive create, so a temporary name is never shared even by mistake.
        with local_path.open("rb") as source, session.sftp.open(remote, "wbx") as target:
            target.set_pipelined(True)
            while chunk := source.read(CHUNK_SIZE):
                target.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        # Closing waited for every write's reply. Only the file recorded at cutoff 2 may be published.
        if size != expected.size or digest.digest() != expected.sha256:
            raise UploadMismatch("the local file is not the expected file recorded at cutoff 2")
        if session.sftp.stat(remote).st_size != expected.size:
            raise UploadMismatch("the temporary file's size differs from the expected size")

    def _rename(self, session: Session, temp: str, final: str, overwrite: bool, baseline: Listing, attempt_id: str,
                record_evidence: RecordEvidence) -> DeliveryOutcome | None:
        """Rename; None when the server confirmed it, an outcome when it refused."""
        source, target = self.config.remote_path(temp), self.config.remote_path(final)
        try:
            if overwrite:
                session.sftp.posix_rename(source, target)
            else:
                session.sftp.rename(source, target)
        except OSError as exc:
            if not is_status_reply(exc):
                raise  # no reply, or a broken connection: the rename may have run
            # The server answered: it refused. OpenSSH says only "Failure", so look rather than parse.
            fresh = listing.list_final(session, self.config, final, with_hash=True)
            self._record(record_evidence, Evidence(EvidenceStage.RENAME_REFUSED, fresh, attempt_id))
            outcome = classify(exc, stage=Stage.RENAME, baseline=baseline, fresh=fresh, rename_refused=True)
            log.warning("delivery.rename_refused attempt_id=%s final_name=%s outcome=%s", attempt_id, final,
                        outcome.status)
            return outcome
        return None

    def _confirm(self, session: Session, expected: ExpectedFile, baseline: Listing, overwrite: bool, attempt_id: str,
                 record_evidence: RecordEvidence) -> DeliveryOutcome:
        after = listing.list_final(session, self.config, expected.name, with_hash=True)
        if self.config.acknowledgments and not after.checksum_matches(expected):
            after = listing.await_ack(session, self.config, after, baseline)
        evidence = Evidence(EvidenceStage.RECEIPT, after, attempt_id)
        self._record(record_evidence, evidence)
        # An acknowledgment only counts if it is new: one already there was for an earlier file.
        fresh_ack = after.ack_matches(expected) and after.ack != baseline.ack
        if after.contradicts(expected):
            return Unknown("after the rename the final name holds a file whose size or hash differs")
        if after.checksum_matches(expected):
            proof = Proof.CHECKSUM
        elif fresh_ack:
            proof = Proof.ACKNOWLEDGMENT
        elif overwrite:
            # Name and size cannot show an overwrite: a rebuilt export can have the same size.
            return Unknown("overwrote the final name but no hash or acknowledgment confirms this upload")
        elif after.present and not baseline.occupied and after.ack is None:
            # Changed from an absent baseline with the expected size, on a server that publishes by
            # atomic rename: reasonable evidence, the weakest Completed accepts.
            proof = Proof.NAME_AND_SIZE
        else:
            return Unknown("the destination does not show the delivered file after the rename")
        return Completed(Receipt(proof=proof, overwrote=overwrite, evidence=evidence))

    def _fresh_listing(self, final: str, attempt_id: str, record_evidence: RecordEvidence,
                       credential: Credential) -> Listing | None:
        """List the final name on a new connection after an interruption; None if that fails too."""
        try:
            with connect(self.config, self._pinned, credential) as session:
                fresh = listing.list_final(session, self.config, final, with_hash=True)
        except Exception as exc:
            log.warning("delivery.fresh_listing_failed attempt_id=%s final_name=%s error=%s", attempt_id, final,
                        describe(exc, redact=credential.redactions()))
            return None
        self._record(record_evidence, Evidence(EvidenceStage.INTERRUPTED, fresh, attempt_id))
        return fresh

    def _remove_temp(self, temp: str, attempt_id: str, session: Session | None, credential: Credential) -> None:
        """Best effort: a leftover temporary file holds contact data and needs the cleanup agreement.
        Without a session, on a new connection."""
        path = self.config.remote_path(temp)
        try:
            if session is not None:
                session.sftp.remove(path)
            else:
                with connect(self.config, self._pinned, credential) as fresh_session:
                    fresh_session.sftp.remove(path)
        except FileNotFoundError:
            return
        except Exception as exc:
            log.warning("delivery.temp_cleanup_failed attempt_id=%s temp_name=%s error=%s", attempt_id, temp,
                        describe(exc, redact=credential.redactions()))
            return
        log.info("delivery.temp_removed attempt_id=%s temp_name=%s", attempt_id, temp)

    @staticmethod
    def _record(record_evidence: RecordEvidence, evidence: Evidence) -> None:
        # Later evidence is a bonus: the outcome carries it too, so a failing recorder must not turn
        # a delivered file into an unknown one.
        try:
            record_evidence(evidence)
        except Exception as exc:
            log.warning("delivery.evidence_not_recorded stage=%s error=%s", evidence.stage.value, describe(exc))


class Ready:
    """A prepared delivery: the session it holds, the baseline it recorded, and whether it overwrites by
    agreement. ``complete`` is for after cutoff 2; ``release`` gives the session back unused."""

    def __init__(self, destination: Destination, source: SessionSource, held: HeldSession, credential: Credential,
                 expected: ExpectedFile, attempt_id: str, baseline: Listing, overwrite: bool,
                 record_evidence: RecordEvidence) -> None:
        self.destination = destination
        self.baseline = baseline
        self.overwrite = overwrite
        self._source = source
        self._held: HeldSession | None = held
        self._credential = credential
        self._expected = expected
        self._attempt_id = attempt_id
        self._record = record_evidence

    @property
    def reused_session(self) -> bool:
        return self._held is not None and self._held.reused

    def release(self, *, reusable: bool = True) -> None:
        """Gives the session back (kept warm when ``reusable`` and the pool wants it). Idempotent."""
        held, self._held = self._held, None
        if held is not None:
            self._source.give_back(held, reusable=reusable)

    def complete(self, local_path: Path | str) -> DeliveryOutcome:
        """Uploads under the temporary name, renames without overwriting (unless agreed), confirms;
        never raises for an ordinary error. A BaseException propagates, with the session closed."""
        if self._held is None:
            raise RuntimeError("the prepared delivery's session was already given back")
        destination, session = self.destination, self._held.session
        expected, attempt_id = self._expected, self._attempt_id
        final, temp = expected.name, temp_name(expected.name, attempt_id)
        fields = f"attempt_id={attempt_id} final_name={final}"
        stage = Stage.UPLOAD
        try:
            destination._upload(session, Path(local_path), temp, expected)
            stage = Stage.RENAME
            outcome = destination._rename(session, temp, final, self.overwrite, self.baseline, attempt_id,
                                          self._record)
            if outcome is not None:
                destination._remove_temp(temp, attempt_id, session, self._credential)
            else:
                stage = Stage.CONFIRM
                outcome = destination._confirm(session, expected, self.baseline, self.overwrite, attempt_id,
                                               self._record)
                log.info("delivery.finished %s outcome=%s", fields, outcome.status)
        except Exception as exc:
            # The session saw an error: it is closed rather than kept, and the look afterwards is taken
            # on a new connection.
            self.release(reusable=False)
            redact = self._credential.redactions()
            fresh = destination._fresh_listing(final, attempt_id, self._record, self._credential)
            outcome = classify(exc, stage=stage, baseline=self.baseline, fresh=fresh, redact=redact)
            log.warning("delivery.interrupted %s stage=%s outcome=%s error=%s", fields, stage.value,
                        outcome.status, describe(exc, redact=redact))
            if stage in (Stage.UPLOAD, Stage.RENAME):
                destination._remove_temp(temp, attempt_id, None, self._credential)
            return outcome
        except BaseException:
            self.release(reusable=False)
            raise
        self.release(reusable=True)
        return outcome


#: What ``prepare`` answers: ready to deliver after cutoff 2, refused by the baseline, or unreachable.
Preparation = Ready | Refused | Unreachable

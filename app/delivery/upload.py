"""After cutoff 2: a prepared delivery (``Ready``) uploads the file, publishes it under its final name
and confirms the delivery from what the destination shows, in the modes that publish by rename
(``app.delivery.modes``: standard, no-stat, quick-ingest; no-rename's is ``app.delivery.in_place``).

- ``Ready.complete`` writes the file on the session ``prepare`` opened, under a temporary name in
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
  classifier, which answers Failed only on proof that the final name was never written; the look
  taken afterwards is on a new connection, and the temporary file is removed where it may remain.
- Where the rename's answer is the receipt (no-stat, which may not look at all; quick-ingest, whose
  partner takes the file at once), an acknowledged rename of the whole, verified upload is recorded
  (``EvidenceStage.RENAMED``) and is Completed's proof when no look shows more.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app import logs
from app.delivery import listing, markers
from app.delivery.classifier import Completed, DeliveryOutcome, Stage, Unknown, classify, describe, is_status_reply
from app.delivery.config import DestinationConfig
from app.delivery.credentials import Credential
from app.delivery.errors import UploadMismatch
from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.delivery.hostkeys import PinnedKeys
from app.delivery.modes import DeliveryMode
from app.delivery.session import Session, connect
from app.delivery.sessions import HeldSession, SessionSource
from app.store.types import ExpectedFile

log = logs.get(__name__)

#: Called with every observation a delivery makes, to append it to the attempt's evidence.
RecordEvidence = Callable[[Evidence], None]


class Ready:
    """A prepared delivery: the session it holds, the baseline it recorded, and whether it overwrites by
    agreement. ``complete`` is for after cutoff 2; ``release`` gives the session back unused."""

    def __init__(self, config: DestinationConfig, pinned: PinnedKeys, source: SessionSource, held: HeldSession,
                 credential: Credential, expected: ExpectedFile, attempt_id: str, baseline: Listing, overwrite: bool,
                 record_evidence: RecordEvidence) -> None:
        self.config = config
        self.baseline = baseline
        self.overwrite = overwrite
        self._pinned = pinned
        self._source = source
        self._held: HeldSession | None = held
        self._credential = credential
        self._expected = expected
        self._attempt_id = attempt_id
        self._record_evidence = record_evidence
        self._fields = {"attempt_id": attempt_id, "final_name": expected.name}
        #: Whether the delivery runs on a warm session; kept, since the session is given back when it ends.
        self.reused_session = held.reused
        self.mode: DeliveryMode = config.delivery_mode

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
        session = self._held.session
        temp = listing.temp_name(self._expected.name, self._attempt_id)
        stage = Stage.UPLOAD
        try:
            self._upload(session, Path(local_path), temp)
            stage = Stage.RENAME
            outcome = self._rename(session, temp)
            if outcome is not None:
                self._remove_temp(temp, session)
            else:
                stage = Stage.CONFIRM
                if self.mode.rename_answer_is_receipt:
                    self._record_later(self._renamed(marked=False))
                outcome = self._confirm(session)
                if isinstance(outcome, Completed) and self._expected.marker_name is not None:
                    outcome = self._mark(session, outcome)
                # DEBUG: the runner's runner.delivered says the outcome, with the terminal write's answer.
                log.debug("delivery.finished", **self._fields, outcome=outcome.status)
        except Exception as exc:
            # The session saw an error: it is closed rather than kept, and the look afterwards is taken
            # on a new connection.
            self.release(reusable=False)
            redact = self._credential.redactions()
            fresh = self._fresh_listing()
            outcome = classify(exc, stage=stage, baseline=self.baseline, fresh=fresh, redact=redact, mode=self.mode)
            log.warning("delivery.interrupted", **self._fields, stage=stage.value, outcome=outcome.status,
                        error=describe(exc, redact=redact))
            if stage in (Stage.UPLOAD, Stage.RENAME):
                self._remove_temp(temp, None)
            return outcome
        except BaseException:
            self.release(reusable=False)
            raise
        self.release(reusable=True)
        return outcome

    def _upload(self, session: Session, local_path: Path, temp: str) -> None:
        remote = self.config.remote_path(temp)
        expected = self._expected
        # An exclusive create, so a temporary name is never shared even by mistake; it returns once
        # the server acknowledged every write.
        size, sha256 = session.upload(local_path, remote, bandwidth_limit=self.config.bandwidth_limit)
        # Only the file recorded at cutoff 2 may be published.
        if size != expected.size or sha256 != expected.sha256:
            raise UploadMismatch("the local file is not the expected file recorded at cutoff 2")
        # Where no look is allowed, every write's acknowledgment is the evidence of a whole upload.
        if self.mode.looks and session.sftp.stat(remote).st_size != expected.size:
            raise UploadMismatch("the temporary file's size differs from the expected size")

    def _rename(self, session: Session, temp: str) -> DeliveryOutcome | None:
        """Rename; None when the server confirmed it, an outcome when it refused."""
        final = self._expected.name
        source, target = self.config.remote_path(temp), self.config.remote_path(final)
        try:
            if self.overwrite:
                session.sftp.posix_rename(source, target)
            else:
                session.sftp.rename(source, target)
        except OSError as exc:
            if not is_status_reply(exc):
                raise  # no reply, or a broken connection: the rename may have run
            # The server answered: it refused. OpenSSH says only "Failure", so look rather than parse
            # (where a look is allowed: otherwise the answer is all there is).
            fresh = (listing.list_final(session, self.config, final, with_hash=True) if self.mode.looks
                     else Listing.not_looked(final))
            self._record_later(Evidence(EvidenceStage.RENAME_REFUSED, fresh, self._attempt_id))
            outcome = classify(exc, stage=Stage.RENAME, baseline=self.baseline, fresh=fresh, rename_refused=True,
                               mode=self.mode)
            log.warning("delivery.rename_refused", **self._fields, outcome=outcome.status)
            return outcome
        return None

    def _renamed(self, *, marked: bool) -> Evidence:
        """What the server's answers showed: the whole upload renamed onto the final name (and the marker,
        once ``marked``). Not a look: the receipt of the modes whose rename's answer is one."""
        expected = self._expected
        return Evidence(EvidenceStage.RENAMED,
                        Listing(final_name=expected.name, present=True, size=expected.size,
                                marker=expected.marker_sha256_hex if marked else None), self._attempt_id)

    def _acknowledged(self, renamed: Evidence) -> DeliveryOutcome:
        if self.overwrite:
            return Unknown("overwrote the final name; the rename's answer cannot show this upload is what is there")
        return Completed(Receipt(proof=Proof.RENAME_ACKNOWLEDGED, overwrote=False, evidence=renamed))

    def _confirm(self, session: Session) -> DeliveryOutcome:
        expected, baseline = self._expected, self.baseline
        if not self.mode.looks:
            return self._acknowledged(self._renamed(marked=False))
        after = listing.list_final(session, self.config, expected.name, with_hash=True)
        if self.config.acknowledgments and not after.checksum_matches(expected):
            after = listing.await_ack(session, self.config, after, baseline)
        evidence = Evidence(EvidenceStage.RECEIPT, after, self._attempt_id)
        self._record_later(evidence)
        # An acknowledgment only counts if it is new: one already there was for an earlier file.
        fresh_ack = after.ack_matches(expected) and after.ack != baseline.ack
        if after.contradicts(expected):
            return Unknown("after the rename the final name holds a file whose size or hash differs")
        if after.checksum_matches(expected):
            proof = Proof.CHECKSUM
        elif fresh_ack:
            proof = Proof.ACKNOWLEDGMENT
        elif self.overwrite:
            # Name and size cannot show an overwrite: a rebuilt export can have the same size.
            return Unknown("overwrote the final name but no hash or acknowledgment confirms this upload")
        elif after.present and not baseline.occupied and after.ack is None:
            # Changed from an absent baseline with the expected size, on a server that publishes by
            # atomic rename: reasonable evidence, the weakest Completed accepts.
            proof = Proof.NAME_AND_SIZE
        elif not after.present and self.mode.rename_answer_is_receipt:
            # The partner's ingestion took it: the rename's answer is the receipt.
            return self._acknowledged(self._renamed(marked=False))
        else:
            return Unknown("the destination does not show the delivered file after the rename")
        return Completed(Receipt(proof=proof, overwrote=self.overwrite, evidence=evidence))

    def _mark(self, session: Session, confirmed: Completed) -> DeliveryOutcome:
        """The completion marker, after the file is confirmed (``app.delivery.markers``), then a look that
        shows both. Completed only with both; the file is delivered either way, so a marker not
        confirmed is Unknown, never Failed (recovery and reconciliation may finish it)."""
        expected = self._expected
        try:
            markers.write_marker(session, self.config, expected, self._attempt_id)
            after = (listing.list_final(session, self.config, expected.name, with_hash=True,
                                        marker_name=expected.marker_name) if self.mode.looks else None)
        except Exception as exc:
            log.warning("delivery.marker_not_confirmed", **self._fields, marker=expected.marker_name,
                        error=describe(exc, redact=self._credential.redactions()))
            return Unknown(f"the file is delivered; its completion marker {expected.marker_name} was not "
                           f"confirmed ({type(exc).__name__})")
        renamed = self._renamed(marked=True)
        if self.mode.rename_answer_is_receipt:
            self._record_later(renamed)
        if after is None:
            return self._acknowledged(renamed)
        evidence = Evidence(EvidenceStage.RECEIPT, after, self._attempt_id)
        self._record_later(evidence)
        if after.contradicts(expected):
            return Unknown(f"after writing {expected.marker_name} the final name holds a file whose size or hash "
                           "differs")
        if not (after.present and after.marker_matches(expected)) and self.mode.rename_answer_is_receipt:
            return self._acknowledged(renamed)
        if not after.marker_matches(expected):
            return Unknown(f"after writing {expected.marker_name} the destination does not show the file and "
                           "its marker as written")
        log.info("delivery.marked", **self._fields, marker=expected.marker_name)
        # The file's proof stands (the confirmation established it); the receipt is the look with both.
        return Completed(Receipt(proof=confirmed.receipt.proof, overwrote=self.overwrite, evidence=evidence))

    def _fresh_listing(self, *, with_marker: bool = False) -> Listing | None:
        """List the final name (and its marker) on a new connection after an interruption; None if that
        fails too, or the mode allows no look."""
        if not self.mode.looks:
            return None
        marker_name = self._expected.marker_name if with_marker else None
        try:
            with connect(self.config, self._pinned, self._credential) as session:
                fresh = listing.list_final(session, self.config, self._expected.name, with_hash=True,
                                           marker_name=marker_name)
        except Exception as exc:
            log.warning("delivery.fresh_listing_failed", **self._fields,
                        error=describe(exc, redact=self._credential.redactions()))
            return None
        self._record_later(Evidence(EvidenceStage.INTERRUPTED, fresh, self._attempt_id))
        return fresh

    def _remove_temp(self, temp: str, session: Session | None) -> None:
        """Best effort: a leftover temporary file holds contact data and needs the cleanup agreement.
        Without a session, on a new connection."""
        path = self.config.remote_path(temp)
        try:
            if session is not None:
                session.sftp.remove(path)
            else:
                with connect(self.config, self._pinned, self._credential) as fresh_session:
                    fresh_session.sftp.remove(path)
        except FileNotFoundError:
            return
        except Exception as exc:
            log.warning("delivery.temp_cleanup_failed", attempt_id=self._attempt_id, temp_name=temp,
                        error=describe(exc, redact=self._credential.redactions()))
            return
        log.info("delivery.temp_removed", attempt_id=self._attempt_id, temp_name=temp)

    def _record_later(self, evidence: Evidence) -> None:
        # Later evidence is a bonus: the outcome carries it too, so a failing recorder must not turn
        # a delivered file into an unknown one.
        try:
            self._record_evidence(evidence)
        except Exception as exc:
            log.warning("delivery.evidence_not_recorded", attempt_id=self._attempt_id, stage=evidence.stage.value,
                        error=describe(exc))

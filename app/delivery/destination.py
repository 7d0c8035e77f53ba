"""Delivering one file to a partner's SFTP destination, and looking at what a final name holds.

Delivery follows the reference's rules for an upload that is safe to interrupt:

- The final name is listed first and the listing is handed to ``record_evidence`` as the baseline
  before a single byte is uploaded, so recovery and reconciliation see what the worker saw.
- An occupied final name is never overwritten by default. An original stops with
  FinalNameOccupied; a replacement stops with OriginalDelivered when the file there is identified as
  the original's delivery, FinalNameOccupied when it cannot be identified, and overwrites only with
  the partner's recorded agreement.
- The file is written under a temporary name in the remote directory,
  ``.<final>.<attempt_id>.part``: a leading dot and a ``.part`` suffix, which the partner agrees to
  ignore, and the attempt id so two attempts never share one. Only a complete, verified upload is
  renamed to the final name.
- The rename is SSH_FXP_RENAME, which on OpenSSH and ProFTPD refuses an existing target, so a file
  that lands between the listing and the rename is never replaced. ``posix-rename@openssh.com``,
  which replaces, is used only for a replacement with an overwrite agreement that found a file.
- Completed needs evidence read back after the rename: name and size changed from an absent
  baseline (the partner publishes by atomic rename), stronger with a checksum (``check-file-name``
  sha256, or a read-back where the contract allows) or the partner's acknowledgment file. An
  overwrite needs the stronger evidence. Anything that stops the delivery part way goes through the
  classifier, which answers Failed only on proof that the final name was never written.

The connection is ``app.delivery.session``'s, the evidence types ``app.delivery.evidence``'s, the
credential is resolved (``app.delivery.credentials``) only when connecting and never logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat as stat_module
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path

from app.delivery.classifier import Completed, DeliveryOutcome, Failed, Stage, Unknown, classify, describe
from app.delivery.config import DestinationConfig
from app.delivery.credentials import Credential, resolve_credential
from app.delivery.errors import UploadMismatch
from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.delivery.session import CHUNK_SIZE, Session, connect, is_status_reply
from app.store.types import ExpectedFile, FailureCode

log = logging.getLogger(__name__)

#: Seconds between two reads of the acknowledgment file while waiting for it.
ACK_POLL_INTERVAL = 0.05
#: The partner writes ``<final>.ack`` holding the sha256 hex of the file it accepted.
ACK_SUFFIX = ".ack"
#: An acknowledgment file larger than this is not an acknowledgment, in bytes.
MAX_ACK_BYTES = 1024

#: Called with every observation a delivery makes, to append it to the attempt's evidence.
RecordEvidence = Callable[[Evidence], None]


def temp_name(final_name: str, attempt_id: str) -> str:
    """The temporary name an attempt uploads under; the partner ignores dot-files ending in .part."""
    return f".{final_name}.{attempt_id}.part"


def ack_name(final_name: str) -> str:
    """The partner's acknowledgment file for a final name."""
    return final_name + ACK_SUFFIX


class Destination:
    """A partner's SFTP destination. Thread-safe: each call opens and closes its own connection."""

    def __init__(self, config: DestinationConfig, *, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._environ = environ if environ is not None else os.environ
        self._pinned = config.pinned_key()

    def __repr__(self) -> str:
        return f"Destination({self.config!r})"

    def _credential(self) -> Credential:
        return resolve_credential(self.config.credential_ref, self._environ)

    def _connect(self, credential: Credential) -> AbstractContextManager[Session]:
        return connect(self.config, self._pinned, credential)

    # -- observation ----------------------------------------------------------------------------

    def inspect(self, final_name: str, *, with_hash: bool = True) -> Listing:
        """What the destination shows now under a final name (for recovery and reconciliation).

        Raises the connection's error if the destination cannot be reached; callers treat that as
        "no evidence", never as absence.
        """
        with self._connect(self._credential()) as session:
            return self._list(session, final_name, with_hash=with_hash)

    def _list(self, session: Session, final_name: str, *, with_hash: bool) -> Listing:
        path = self.config.remote_path(final_name)
        ack = self._read_ack(session, final_name) if self.config.acknowledgments else None
        try:
            attrs = session.sftp.stat(path)
        except FileNotFoundError:
            return Listing(final_name=final_name, present=False, ack=ack)
        if attrs.st_mode is not None and not stat_module.S_ISREG(attrs.st_mode):
            # A directory or special file still occupies the name; it just cannot be a delivery.
            return Listing(final_name=final_name, present=True, size=None, mtime=attrs.st_mtime, ack=ack)
        digest, source = (None, None)
        if with_hash:
            digest, source = self._hash(session, path)
        return Listing(final_name=final_name, present=True, size=attrs.st_size, mtime=attrs.st_mtime, sha256=digest,
                       hash_source=source, ack=ack)

    def _hash(self, session: Session, path: str) -> tuple[bytes | None, str | None]:
        if self.config.remote_hash:
            digest = session.remote_sha256(path)
            if digest is not None:
                return digest, "check-file-name"
        if self.config.read_back:
            return session.read_back_sha256(path), "read-back"
        return None, None

    def _read_ack(self, session: Session, final_name: str) -> str | None:
        path = self.config.remote_path(ack_name(final_name))
        try:
            with session.sftp.open(path, "rb") as remote:
                raw = remote.read(MAX_ACK_BYTES + 1)
        except FileNotFoundError:
            return None
        if len(raw) > MAX_ACK_BYTES:
            return "<oversized>"
        return raw.decode("ascii", errors="replace").strip().lower()

    # -- delivery -------------------------------------------------------------------------------

    def deliver(self, local_path: Path | str, expected: ExpectedFile, *, attempt_id: str, replacement: bool = False,
                replacement_of: ExpectedFile | None = None, overwrite_agreed: bool = False,
                record_evidence: RecordEvidence) -> DeliveryOutcome:
        """Deliver ``local_path`` under ``expected.name``; never raises for an ordinary error.

        ``replacement`` says the job replaces an original, whose expected file (``replacement_of``) is
        known only if the original reached cutoff 2. ``record_evidence`` is called with the baseline
        before any upload (if it raises, nothing is uploaded), and with every later observation
        (receipt, refused rename, interruption).
        A BaseException (shutdown, time limit) propagates unchanged; the caller classifies it with
        ``classify(exc, stage=Stage.UNKNOWN)``, which is always OutcomeUnknown.
        """
        final = expected.name
        temp = temp_name(final, attempt_id)
        # Programming errors, raised before anything is sent rather than classified.
        self.config.remote_path(final)
        self.config.remote_path(temp)
        stage = Stage.CONNECT
        baseline: Listing | None = None
        credential: Credential | None = None
        fields = f"attempt_id={attempt_id} final_name={final}"
        try:
            credential = self._credential()
            with self._connect(credential) as session:
                stage = Stage.BASELINE
                baseline = self._list(session, final, with_hash=True)
                # Recorded before anything is uploaded: if it cannot be recorded, nothing is.
                record_evidence(Evidence(EvidenceStage.BASELINE, baseline, attempt_id))
                log.info("delivery.baseline %s present=%s size=%s", fields, baseline.present, baseline.size)
                decision = self._decide(baseline, replacement or replacement_of is not None, replacement_of,
                                        overwrite_agreed)
                if isinstance(decision, Failed):
                    log.info("delivery.refused %s code=%s", fields, decision.code.value)
                    return decision
                overwrite = decision
                stage = Stage.UPLOAD
                self._upload(session, Path(local_path), temp, expected)
                stage = Stage.RENAME
                outcome = self._rename(session, temp, final, overwrite, baseline, attempt_id, record_evidence)
                if outcome is not None:
                    self._remove_temp(temp, attempt_id, session)
                    return outcome
                stage = Stage.CONFIRM
                outcome = self._confirm(session, expected, baseline, overwrite, attempt_id, record_evidence)
                log.info("delivery.finished %s outcome=%s", fields, outcome.status)
                return outcome
        except Exception as exc:
            redact = credential.redactions() if credential is not None else ()
            fresh = None
            if stage in (Stage.UPLOAD, Stage.RENAME, Stage.CONFIRM):
                fresh = self._fresh_listing(final, attempt_id, record_evidence, credential)
            outcome = classify(exc, stage=stage, baseline=baseline, fresh=fresh, redact=redact)
            log.warning("delivery.interrupted %s stage=%s outcome=%s error=%s", fields, stage.value, outcome.status,
                        describe(exc, redact=redact))
            if stage in (Stage.UPLOAD, Stage.RENAME):
                self._remove_temp(temp, attempt_id, None, credential)
            return outcome

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
            fresh = self._list(session, final, with_hash=True)
            self._record(record_evidence, Evidence(EvidenceStage.RENAME_REFUSED, fresh, attempt_id))
            outcome = classify(exc, stage=Stage.RENAME, baseline=baseline, fresh=fresh, rename_refused=True)
            log.warning("delivery.rename_refused attempt_id=%s final_name=%s outcome=%s", attempt_id, final,
                        outcome.status)
            return outcome
        return None

    def _confirm(self, session: Session, expected: ExpectedFile, baseline: Listing, overwrite: bool, attempt_id: str,
                 record_evidence: RecordEvidence) -> DeliveryOutcome:
        after = self._list(session, expected.name, with_hash=True)
        if self.config.acknowledgments and not after.checksum_matches(expected):
            after = self._await_ack(session, after, baseline)
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

    def _await_ack(self, session: Session, after: Listing, baseline: Listing) -> Listing:
        deadline = time.monotonic() + self.config.ack_wait
        ack = after.ack
        while ack is None or ack == baseline.ack:
            if time.monotonic() >= deadline:
                break
            time.sleep(ACK_POLL_INTERVAL)
            ack = self._read_ack(session, after.final_name)
        if ack == after.ack:
            return after
        return Listing(final_name=after.final_name, present=after.present, size=after.size, mtime=after.mtime,
                       sha256=after.sha256, hash_source=after.hash_source, ack=ack)

    def _fresh_listing(self, final: str, attempt_id: str, record_evidence: RecordEvidence,
                       credential: Credential | None) -> Listing | None:
        """List the final name on a new connection after an interruption; None if that fails too."""
        if credential is None:
            return None
        try:
            with self._connect(credential) as session:
                fresh = self._list(session, final, with_hash=True)
        except Exception as exc:
            log.warning("delivery.fresh_listing_failed attempt_id=%s final_name=%s error=%s", attempt_id, final,
                        describe(exc, redact=credential.redactions()))
            return None
        self._record(record_evidence, Evidence(EvidenceStage.INTERRUPTED, fresh, attempt_id))
        return fresh

    def _remove_temp(
        self, temp: str, attempt_id: str, session: Session | None, credential: Credential | None = None
    ) -> None:
        """Best effort: a leftover temporary file holds contact data and needs the cleanup agreement."""
        path = self.config.remote_path(temp)
        try:
            if session is not None:
                session.sftp.remove(path)
            elif credential is not None:
                with self._connect(credential) as fresh_session:
                    fresh_session.sftp.remove(path)
            else:
                return
        except FileNotFoundError:
            return
        except Exception as exc:
            redact = credential.redactions() if credential is not None else ()
            log.warning("delivery.temp_cleanup_failed attempt_id=%s temp_name=%s error=%s", attempt_id, temp,
                        describe(exc, redact=redact))
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

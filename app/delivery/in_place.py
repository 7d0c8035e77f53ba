"""After cutoff 2, in mode no-rename (``app.delivery.modes``): for a server that refuses rename, or whose
rename replaces an existing file, the file is written in place under its final name and the completion
marker published after it.

- The file is created under its final name by an exclusive create, so it never replaces a file that
  appeared since the baseline. Until its marker exists it is a transfer in progress, like a temporary
  file in the other modes: the partner ingests on the marker, so a file under the final name never
  counts as delivered without the marker as recorded.
- The marker, once the file is whole and its size confirmed, is created by an exclusive create too (it
  is never written over one already there): that create is the one irreversible step.
- An interruption before the marker's create was sent leaves at most this attempt's own partial file:
  it is removed on a new connection, and only a look that then shows neither the file nor the marker
  makes the outcome Failed (NotDelivered). Once the marker's create was sent, or where the removal or
  the look failed, the outcome is Unknown: recovery and reconciliation settle it from what the
  destination shows, never Completed without the marker as recorded.
"""

from __future__ import annotations

from pathlib import Path

from app import logs
from app.delivery import listing, markers
from app.delivery.classifier import Completed, DeliveryOutcome, Stage, Unknown, classify, describe
from app.delivery.errors import UploadMismatch
from app.delivery.evidence import Evidence, EvidenceStage, Proof, Receipt
from app.delivery.session import Session, connect
from app.delivery.upload import Ready

log = logs.get(__name__)


class InPlace(Ready):
    """A prepared delivery in mode no-rename; the profile writes a completion marker (``prepare`` checks)."""

    def complete(self, local_path: Path | str) -> DeliveryOutcome:
        """Uploads in place, creates the marker, confirms; never raises for an ordinary error. A
        BaseException propagates, with the session closed."""
        if self._held is None:
            raise RuntimeError("the prepared delivery's session was already given back")
        session = self._held.session
        created: list[bool] = []
        stage = Stage.UPLOAD
        try:
            self._upload_in_place(session, Path(local_path), lambda: created.append(True))
            stage = Stage.MARKER
            self._create_marker(session)
            stage = Stage.CONFIRM
            outcome = self._confirm_both(session)
            # DEBUG: the runner's runner.delivered says the outcome, with the terminal write's answer.
            log.debug("delivery.finished", **self._fields, outcome=outcome.status)
        except Exception as exc:
            self.release(reusable=False)
            redact = self._credential.redactions()
            if stage is Stage.UPLOAD and created:
                # Ours, by its exclusive create, and not published without its marker: a transfer in
                # progress, removed like a temporary file.
                self._remove_partial()
            fresh = self._fresh_listing(with_marker=True)
            outcome = classify(exc, stage=stage, baseline=self.baseline, fresh=fresh, redact=redact, mode=self.mode)
            log.warning("delivery.interrupted", **self._fields, stage=stage.value, outcome=outcome.status,
                        error=describe(exc, redact=redact))
            return outcome
        except BaseException:
            self.release(reusable=False)
            raise
        self.release(reusable=True)
        return outcome

    def _upload_in_place(self, session: Session, local_path: Path, opened) -> None:
        remote = self.config.remote_path(self._expected.name)
        size, sha256 = session.upload(local_path, remote, bandwidth_limit=self.config.bandwidth_limit, opened=opened)
        if size != self._expected.size or sha256 != self._expected.sha256:
            raise UploadMismatch("the local file is not the expected file recorded at cutoff 2")
        if session.sftp.stat(remote).st_size != self._expected.size:
            raise UploadMismatch("the file's size under its final name differs from the expected size")

    def _create_marker(self, session: Session) -> None:
        # An exclusive create in this mode (``markers.write_marker``): the step that publishes the file.
        markers.write_marker(session, self.config, self._expected, self._attempt_id)

    def _confirm_both(self, session: Session) -> DeliveryOutcome:
        expected = self._expected
        after = listing.list_final(session, self.config, expected.name, with_hash=True,
                                   marker_name=expected.marker_name)
        evidence = Evidence(EvidenceStage.RECEIPT, after, self._attempt_id)
        self._record_later(evidence)
        if not after.present or after.contradicts(expected) or not after.marker_matches(expected):
            return Unknown(f"after creating {expected.marker_name} the destination does not show the file and its "
                           "marker as written")
        log.info("delivery.marked", **self._fields, marker=expected.marker_name)
        proof = Proof.CHECKSUM if after.checksum_matches(expected) else Proof.NAME_AND_SIZE
        return Completed(Receipt(proof=proof, overwrote=False, evidence=evidence))

    def _remove_partial(self) -> None:
        """Best effort, on a new connection; where it fails the look afterwards shows the file, and the
        outcome is Unknown."""
        try:
            with connect(self.config, self._pinned, self._credential) as fresh_session:
                fresh_session.sftp.remove(self.config.remote_path(self._expected.name))
        except FileNotFoundError:
            return
        except Exception as exc:
            log.warning("delivery.partial_not_removed", **self._fields,
                        error=describe(exc, redact=self._credential.redactions()))
            return
        log.info("delivery.partial_removed", **self._fields)

"""The delivery modes' matrix: every real server and quirk the tests run (``tests.fixtures.partners``) x every
delivery mode that fits it (``Server.modes``: its ``destination check`` capabilities meet the mode's needs,
and its quirk does not defeat it).

For each cell: a delivery is made once, with the evidence the mode documents (``docs/protocol.md``,
"Delivery modes"); a connection cut after the irreversible step's request was performed, before its
answer (``exports_devtools.sftp_cuts``), ends Unknown and then, from the evidence recorded,
Completed or OutcomeUnknown as the mode's rules say; a connection cut part way into the upload
(``exports_devtools.tcp_proxy``) ends Failed with nothing under the final name. Never Failed with a
file on the partner, never two files. Servers are shared by a module's tests, one at a time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.delivery.classifier import Completed, Failed, Unknown, outcome_evidence
from app.delivery.destination import Destination
from app.delivery.evidence import Evidence, EvidenceStage, Proof
from app.delivery.modes import DeliveryMode
from app.delivery.verdicts import Resolution, decide_delivery, parse_evidence
from app.store.types import ExpectedFile, FailureCode
from exports_devtools.sftp_cuts import cut_after_request
from exports_devtools.tcp_proxy import TcpProxy
from tests.fixtures.partners import BY_ID, SERVERS, Partner

SIZE = 150_000
CELLS = [pytest.param(server.id, mode, id=f"{server.id}-{mode.value}") for server in SERVERS for mode in server.modes]
S = EvidenceStage
#: What a delivery made once records, in order, in each mode (with a completion marker).
DOCUMENTED = {
    DeliveryMode.STANDARD: [S.BASELINE, S.RECEIPT, S.RECEIPT],
    DeliveryMode.NO_STAT: [S.BASELINE, S.RENAMED, S.RENAMED],
    DeliveryMode.NO_RENAME: [S.BASELINE, S.RECEIPT],
    DeliveryMode.QUICK_INGEST: [S.BASELINE, S.RENAMED, S.RECEIPT, S.RENAMED, S.RECEIPT],
}
#: Completed's proof in each mode; quick-ingest's look may still see the file before the ingestion takes it.
PROOFS = {
    DeliveryMode.STANDARD: {Proof.NAME_AND_SIZE, Proof.CHECKSUM},
    DeliveryMode.NO_STAT: {Proof.RENAME_ACKNOWLEDGED},
    DeliveryMode.NO_RENAME: {Proof.NAME_AND_SIZE, Proof.CHECKSUM},
    DeliveryMode.QUICK_INGEST: {Proof.RENAME_ACKNOWLEDGED, Proof.NAME_AND_SIZE, Proof.CHECKSUM},
}


@pytest.fixture(scope="module")
def partner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Partner]:
    server = BY_ID[request.param]
    with server.start(tmp_path_factory.mktemp(server.id)) as running:
        yield running


@dataclasses.dataclass
class Export:
    local: Path
    data: bytes
    expected: ExpectedFile
    attempt_id: str
    evidence: list[Evidence] = dataclasses.field(default_factory=list)

    def record(self, evidence: Evidence) -> None:
        self.evidence.append(evidence)

    @property
    def stages(self) -> list[EvidenceStage]:
        return [e.stage for e in self.evidence]

    def verdict(self, outcome, mode: DeliveryMode) -> Resolution:
        """What recovery or reconciliation concludes from this attempt's recorded evidence alone."""
        details = [e.to_detail() for e in self.evidence] + [outcome_evidence(outcome, self.attempt_id)]
        return decide_delivery(self.expected, replacement=False, evidence=parse_evidence(details), listing=None,
                               inspect_error=None, mode=mode).resolution


def make_export(tmp_path: Path, *, marker: str | None) -> Export:
    """A built file, with a completion marker: ``"manifest"`` (content), ``"done"`` (empty) or None."""
    data = os.urandom(SIZE)
    name = f"contacts-{uuid.uuid4().hex}.csv"
    local = tmp_path / "built.csv"
    local.write_bytes(data)
    content = {"manifest": f'{{"name":"{name}","bytes":{SIZE}}}'.encode(), "done": b"", None: None}[marker]
    marker_name = None if marker is None else f"{name}.{'manifest.json' if marker == 'manifest' else marker}"
    expected = ExpectedFile(name, SIZE, hashlib.sha256(data).digest(), marker_name, content)
    return Export(local, data, expected, uuid.uuid4().hex)


#: Seconds a matrix delivery waits to connect and for each reply: nothing here tests a timeout, and a
#: loaded machine must not turn a slow handshake into a failed cell.
PATIENT = 60.0


def destination(partner: Partner, mode: DeliveryMode, **changes: object) -> Destination:
    return partner.peer.destination(delivery_mode=mode, connect_timeout=PATIENT, io_timeout=PATIENT, **changes)


def leftovers(partner: Partner) -> list[str]:
    """Temporary files in the inbox, by name only (a file renamed while being read is not an error)."""
    return [path.name for path in partner.peer.inbox.iterdir() if path.name.endswith(".part")]


@pytest.mark.parametrize(("partner", "mode"), CELLS, indirect=["partner"])
def test_a_delivery_is_made_once_with_the_evidence_its_mode_documents(
        partner: Partner, mode: DeliveryMode, tmp_path: Path) -> None:
    partner.clear()
    export = make_export(tmp_path, marker="manifest")

    outcome = destination(partner, mode).deliver(export.local, export.expected, attempt_id=export.attempt_id,
                                                 record_evidence=export.record)

    assert isinstance(outcome, Completed), outcome
    assert outcome.receipt.proof in PROOFS[mode]
    if partner.taken is None:
        assert outcome.receipt.proof is not Proof.RENAME_ACKNOWLEDGED or not mode.looks
    assert partner.copies(export.expected.name) == [export.data]
    assert partner.copies(export.expected.marker_name or "") == [export.expected.marker]
    assert leftovers(partner) == []
    assert export.stages == DOCUMENTED[mode]
    assert export.evidence[0].listing.observed is mode.looks
    assert export.verdict(outcome, mode) is Resolution.COMPLETED


@pytest.mark.parametrize(("partner", "mode"), CELLS, indirect=["partner"])
def test_a_cut_after_the_irreversible_request_is_unknown_then_settled_as_the_mode_says_never_two_files(
        partner: Partner, mode: DeliveryMode, tmp_path: Path) -> None:
    partner.clear()
    # An empty marker in no-rename: its exclusive create is all of it (a manifest's content goes after;
    # see the test below for a cut between the two).
    export = make_export(tmp_path, marker="done" if mode.needs_marker else None)
    final, marker = export.expected.name, export.expected.marker_name
    if mode.renames:
        request, target = "rename", final

        def performed() -> bool:
            return not any(final in name for name in leftovers(partner)) and bool(partner.copies(final))
    else:
        request, target = "create", marker or ""

        def performed() -> bool:
            return bool(partner.copies(target))

    with cut_after_request(request, target_contains=target, performed=performed) as cut:
        outcome = destination(partner, mode).deliver(export.local, export.expected, attempt_id=export.attempt_id,
                                                     record_evidence=export.record)

    assert cut.fired.is_set() and cut.performed
    assert isinstance(outcome, Unknown), outcome
    assert partner.copies(final) == [export.data]   # once: never two files, never a Failed with one there
    # Settled from the evidence: a look taken afterwards proves it where the mode may look and the partner
    # left the file there; otherwise it waits for the partner's word.
    still_there = (partner.peer.inbox / final).is_file()
    settles = Resolution.COMPLETED if mode.looks and still_there else Resolution.OUTCOME_UNKNOWN
    assert export.verdict(outcome, mode) is settles
    assert export.stages == ([S.BASELINE, S.INTERRUPTED] if mode.looks else [S.BASELINE])
    if mode in (DeliveryMode.STANDARD, DeliveryMode.NO_RENAME):
        assert settles is Resolution.COMPLETED


@pytest.mark.parametrize(("partner", "mode"), CELLS, indirect=["partner"])
def test_a_cut_part_way_into_the_upload_fails_not_delivered_and_leaves_nothing_under_the_final_name(
        partner: Partner, mode: DeliveryMode, tmp_path: Path) -> None:
    partner.clear()
    export = make_export(tmp_path, marker="manifest" if mode.needs_marker else None)
    proxy = TcpProxy(partner.peer.config.port)
    keytype, key = partner.peer.config.host_key.split()[1:3]
    routed = destination(partner, mode, port=proxy.port, host_key=f"[127.0.0.1]:{proxy.port} {keytype} {key}")

    def record(evidence: Evidence) -> None:
        export.record(evidence)
        if evidence.stage is S.BASELINE:
            proxy.cut_after(40_000)   # part way into the upload: the baseline is the last thing before it

    try:
        outcome = routed.deliver(export.local, export.expected, attempt_id=export.attempt_id, record_evidence=record)
    finally:
        proxy.close()

    assert proxy.cut.is_set()
    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED, outcome
    assert partner.copies(export.expected.name) == []
    assert partner.copies(export.expected.marker_name or "") == []
    assert leftovers(partner) == []
    assert export.stages == ([S.BASELINE, S.INTERRUPTED] if mode.looks else [S.BASELINE])


@pytest.mark.parametrize("partner", ["openssh-no-rename"], indirect=True)
def test_in_place_a_cut_between_the_manifests_create_and_its_content_is_unknown_and_never_completed(
        partner: Partner, tmp_path: Path) -> None:
    partner.clear()
    export = make_export(tmp_path, marker="manifest")
    marker = export.expected.marker_name or ""

    with cut_after_request("create", target_contains=marker, performed=lambda: bool(partner.copies(marker))) as cut:
        outcome = destination(partner, DeliveryMode.NO_RENAME).deliver(
            export.local, export.expected, attempt_id=export.attempt_id, record_evidence=export.record)

    assert cut.performed and isinstance(outcome, Unknown)
    # The marker exists, empty: not the one recorded, so nothing proves the delivery; a person looks.
    assert partner.copies(marker) == [b""] and partner.copies(export.expected.name) == [export.data]
    assert export.verdict(outcome, DeliveryMode.NO_RENAME) is Resolution.OUTCOME_UNKNOWN

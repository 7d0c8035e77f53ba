"""The partner destination against real peers: the embedded server, OpenSSH, and ProFTPD for hashes.

Faults are placed with the embedded server's hooks, a TCP proxy, or the evidence recorder (which
runs right after the baseline listing, before any upload), never with sleeps.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app import logs
from app.delivery.classifier import Completed, Failed, Unknown
from app.delivery.destination import Destination
from app.delivery.errors import CredentialError
from app.delivery.evidence import Evidence, EvidenceStage, Proof
from app.delivery.listing import ack_name, temp_name
from app.store.types import ExpectedFile, FailureCode
from tests.fixtures.sftp import SftpPeer, key_secrets, make_client_key

FINAL = "contacts-tenant-7-key-42.csv"
SIZE = 200_000

PEERS = [
    pytest.param("embedded_sftp", id="embedded"),
    pytest.param("openssh_sftp", id="openssh", marks=pytest.mark.openssh),
]
HASH_PEERS = [
    pytest.param("embedded_sftp", id="embedded"),
    pytest.param("proftpd_sftp", id="proftpd", marks=pytest.mark.proftpd),
]


@pytest.fixture(params=PEERS)
def peer(request: pytest.FixtureRequest) -> SftpPeer:
    """A peer without remote hashing: the embedded server and a real OpenSSH."""
    return request.getfixturevalue(request.param)


@pytest.fixture(params=HASH_PEERS)
def hash_peer(request: pytest.FixtureRequest) -> SftpPeer:
    """A peer that computes sha256 through check-file-name: the embedded server and ProFTPD."""
    found: SftpPeer = request.getfixturevalue(request.param)
    if found.server is not None:
        found.server.remote_hash = True
    return found.with_config(remote_hash=True)


def make_export(tmp_path: Path, data: bytes | None = None, *, name: str = FINAL) -> tuple[Path, ExpectedFile]:
    data = os.urandom(SIZE) if data is None else data
    path = tmp_path / f"local-{hashlib.sha256(data).hexdigest()[:12]}.csv"
    path.write_bytes(data)
    return path, ExpectedFile(name=name, size=len(data), sha256=hashlib.sha256(data).digest())


def expected_for(data: bytes, name: str = FINAL) -> ExpectedFile:
    return ExpectedFile(name=name, size=len(data), sha256=hashlib.sha256(data).digest())


@dataclass
class Recorder:
    """The worker's evidence sink; snapshots the inbox at each call and runs a hook per stage."""

    peer: SftpPeer
    evidence: list[Evidence] = field(default_factory=list)
    inbox_at: list[dict[str, bytes]] = field(default_factory=list)
    hooks: dict[EvidenceStage, Callable[[], None]] = field(default_factory=dict)

    def __call__(self, evidence: Evidence) -> None:
        self.evidence.append(evidence)
        self.inbox_at.append(self.peer.files())
        hook = self.hooks.pop(evidence.stage, None)
        if hook is not None:
            hook()

    @property
    def stages(self) -> list[EvidenceStage]:
        return [item.stage for item in self.evidence]


def no_temp_files(peer: SftpPeer) -> bool:
    return not any(name.endswith(".part") for name in peer.files())


# -- originals -------------------------------------------------------------------------------------


def test_an_original_is_completed_with_a_receipt_after_its_baseline_was_recorded_before_upload(
    peer: SftpPeer, tmp_path: Path
) -> None:
    local, expected = make_export(tmp_path)
    record = Recorder(peer)

    outcome = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=record)

    assert isinstance(outcome, Completed)
    assert outcome.receipt.proof is Proof.NAME_AND_SIZE
    assert outcome.receipt.overwrote is False
    assert (peer.inbox / FINAL).read_bytes() == local.read_bytes()
    assert record.stages == [EvidenceStage.BASELINE, EvidenceStage.RECEIPT]
    baseline = record.evidence[0]
    assert baseline.listing.present is False and baseline.attempt_id == "att-1"
    # Recorded before a single byte was uploaded: the inbox was empty when the recorder ran.
    assert record.inbox_at[0] == {}
    assert '"stage":"baseline"' in baseline.to_detail()
    assert no_temp_files(peer)


def test_an_original_on_a_hashing_server_completes_with_checksum_proof(hash_peer: SftpPeer, tmp_path: Path) -> None:
    local, expected = make_export(tmp_path)

    outcome = hash_peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=Recorder(hash_peer))

    assert isinstance(outcome, Completed)
    assert outcome.receipt.proof is Proof.CHECKSUM
    assert outcome.receipt.evidence.listing.sha256 == expected.sha256
    assert outcome.receipt.evidence.listing.hash_source == "check-file-name"


def test_an_original_completes_on_the_partners_acknowledgment(embedded_sftp: SftpPeer, tmp_path: Path) -> None:
    peer = embedded_sftp
    assert peer.server is not None
    peer.server.acknowledgments = True
    local, expected = make_export(tmp_path)

    outcome = peer.destination(acknowledgments=True).deliver(
        local, expected, attempt_id="att-1", record_evidence=Recorder(peer)
    )

    assert isinstance(outcome, Completed)
    assert outcome.receipt.proof is Proof.ACKNOWLEDGMENT
    assert outcome.receipt.evidence.listing.ack == expected.sha256_hex


def test_a_baseline_that_cannot_be_recorded_stops_the_delivery_before_any_upload(
    peer: SftpPeer, tmp_path: Path
) -> None:
    local, expected = make_export(tmp_path)

    def database_down(evidence: Evidence) -> None:
        raise ConnectionError("evidence store unreachable")

    outcome = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=database_down)

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED
    assert peer.files() == {}


def test_an_original_whose_final_name_is_occupied_fails_final_name_occupied_and_uploads_nothing(
    peer: SftpPeer, tmp_path: Path
) -> None:
    existing = b"someone else's file\n"
    (peer.inbox / FINAL).write_bytes(existing)
    local, expected = make_export(tmp_path)
    record = Recorder(peer)

    outcome = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=record)

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.FINAL_NAME_OCCUPIED
    assert peer.files() == {FINAL: existing}
    assert record.stages == [EvidenceStage.BASELINE]
    assert record.evidence[0].listing.present is True


def test_an_original_whose_local_file_is_not_the_expected_file_is_never_published(
    peer: SftpPeer, tmp_path: Path
) -> None:
    local, expected = make_export(tmp_path)
    local.write_bytes(os.urandom(SIZE))  # changed after cutoff 2 recorded the expected file

    outcome = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=Recorder(peer))

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED
    assert peer.files() == {}


# -- replacements ----------------------------------------------------------------------------------


def test_a_replacement_finding_the_originals_file_by_checksum_ends_original_delivered(
    hash_peer: SftpPeer, tmp_path: Path
) -> None:
    original = os.urandom(SIZE)
    (hash_peer.inbox / FINAL).write_bytes(original)
    local, expected = make_export(tmp_path)

    outcome = hash_peer.destination().deliver(
        local,
        expected,
        attempt_id="att-r",
        replacement_of=expected_for(original),
        overwrite_agreed=True,
        record_evidence=Recorder(hash_peer),
    )

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.ORIGINAL_DELIVERED
    assert "checksum" in outcome.detail
    assert hash_peer.files() == {FINAL: original}


def test_a_replacement_finding_an_acknowledgment_of_the_original_ends_original_delivered(
    peer: SftpPeer, tmp_path: Path
) -> None:
    original = os.urandom(SIZE)
    (peer.inbox / FINAL).write_bytes(original)
    (peer.inbox / ack_name(FINAL)).write_text(hashlib.sha256(original).hexdigest() + "\n")
    local, expected = make_export(tmp_path)

    outcome = peer.destination(acknowledgments=True).deliver(
        local, expected, attempt_id="att-r", replacement_of=expected_for(original), record_evidence=Recorder(peer)
    )

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.ORIGINAL_DELIVERED
    assert (peer.inbox / FINAL).read_bytes() == original


def test_a_replacement_identifies_the_original_by_name_and_size_where_the_contract_says_so(
    peer: SftpPeer, tmp_path: Path
) -> None:
    original = os.urandom(SIZE)
    (peer.inbox / FINAL).write_bytes(original)
    local, expected = make_export(tmp_path)

    outcome = peer.destination(name_and_size_identify=True).deliver(
        local, expected, attempt_id="att-r", replacement_of=expected_for(original), record_evidence=Recorder(peer)
    )

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.ORIGINAL_DELIVERED
    assert peer.files() == {FINAL: original}


def test_a_replacement_finding_a_same_size_file_it_cannot_identify_ends_final_name_occupied(
    peer: SftpPeer, tmp_path: Path
) -> None:
    original = os.urandom(SIZE)
    unknown = os.urandom(SIZE)  # same size, different bytes, and no hash to tell them apart
    (peer.inbox / FINAL).write_bytes(unknown)
    local, expected = make_export(tmp_path)

    outcome = peer.destination().deliver(
        local, expected, attempt_id="att-r", replacement_of=expected_for(original), record_evidence=Recorder(peer)
    )

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.FINAL_NAME_OCCUPIED
    assert peer.files() == {FINAL: unknown}


def test_a_replacement_finding_a_different_file_without_agreement_ends_final_name_occupied(
    hash_peer: SftpPeer, tmp_path: Path
) -> None:
    original = os.urandom(SIZE)
    different = os.urandom(SIZE)
    (hash_peer.inbox / FINAL).write_bytes(different)
    local, expected = make_export(tmp_path)
    record = Recorder(hash_peer)

    outcome = hash_peer.destination().deliver(
        local, expected, attempt_id="att-r", replacement_of=expected_for(original), record_evidence=record
    )

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.FINAL_NAME_OCCUPIED
    assert record.evidence[0].listing.sha256 == hashlib.sha256(different).digest()
    assert hash_peer.files() == {FINAL: different}


def test_a_replacement_whose_original_recorded_no_expected_file_finding_a_file_ends_final_name_occupied(
    peer: SftpPeer, tmp_path: Path
) -> None:
    unknown = os.urandom(SIZE)
    (peer.inbox / FINAL).write_bytes(unknown)
    local, expected = make_export(tmp_path)

    outcome = peer.destination().deliver(
        local, expected, attempt_id="att-r", replacement=True, record_evidence=Recorder(peer)
    )

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.FINAL_NAME_OCCUPIED
    assert peer.files() == {FINAL: unknown}


def test_a_replacement_whose_original_recorded_no_expected_file_overwrites_only_by_agreement(
    hash_peer: SftpPeer, tmp_path: Path
) -> None:
    (hash_peer.inbox / FINAL).write_bytes(os.urandom(SIZE))
    local, expected = make_export(tmp_path)

    outcome = hash_peer.destination().deliver(
        local, expected, attempt_id="att-r", replacement=True, overwrite_agreed=True,
        record_evidence=Recorder(hash_peer),
    )

    assert isinstance(outcome, Completed) and outcome.receipt.overwrote is True
    assert hash_peer.files() == {FINAL: local.read_bytes()}


def test_an_agreed_overwrite_of_a_same_size_rebuild_completes_on_a_matching_hash(
    hash_peer: SftpPeer, tmp_path: Path
) -> None:
    original = os.urandom(SIZE)
    (hash_peer.inbox / "other").write_bytes(b"")  # unrelated files stay untouched
    unknown = os.urandom(SIZE)
    (hash_peer.inbox / FINAL).write_bytes(unknown)
    local, expected = make_export(tmp_path)

    outcome = hash_peer.destination().deliver(
        local,
        expected,
        attempt_id="att-r",
        replacement_of=expected_for(original),
        overwrite_agreed=True,
        record_evidence=Recorder(hash_peer),
    )

    assert isinstance(outcome, Completed)
    assert outcome.receipt.proof is Proof.CHECKSUM and outcome.receipt.overwrote is True
    assert hash_peer.files() == {FINAL: local.read_bytes(), "other": b""}


def test_an_agreed_overwrite_completes_on_the_partners_acknowledgment_of_this_upload(
    embedded_sftp: SftpPeer, tmp_path: Path
) -> None:
    peer = embedded_sftp
    assert peer.server is not None
    peer.server.acknowledgments = True
    original, unknown = os.urandom(SIZE), os.urandom(SIZE)
    (peer.inbox / FINAL).write_bytes(unknown)
    (peer.inbox / ack_name(FINAL)).write_text(hashlib.sha256(unknown).hexdigest())
    local, expected = make_export(tmp_path)

    outcome = peer.destination(acknowledgments=True).deliver(
        local,
        expected,
        attempt_id="att-r",
        replacement_of=expected_for(original),
        overwrite_agreed=True,
        record_evidence=Recorder(peer),
    )

    assert isinstance(outcome, Completed)
    assert outcome.receipt.proof is Proof.ACKNOWLEDGMENT and outcome.receipt.overwrote is True
    assert (peer.inbox / FINAL).read_bytes() == local.read_bytes()


def test_an_agreed_overwrite_completes_on_a_read_back_hash_where_the_contract_allows_it(
    peer: SftpPeer, tmp_path: Path
) -> None:
    original, unknown = os.urandom(SIZE), os.urandom(SIZE)
    (peer.inbox / FINAL).write_bytes(unknown)
    local, expected = make_export(tmp_path)

    outcome = peer.destination(read_back=True).deliver(
        local,
        expected,
        attempt_id="att-r",
        replacement_of=expected_for(original),
        overwrite_agreed=True,
        record_evidence=Recorder(peer),
    )

    assert isinstance(outcome, Completed)
    assert outcome.receipt.proof is Proof.CHECKSUM
    assert outcome.receipt.evidence.listing.hash_source == "read-back"


def test_an_agreed_overwrite_without_hash_or_acknowledgment_is_unknown(peer: SftpPeer, tmp_path: Path) -> None:
    original, unknown = os.urandom(SIZE), os.urandom(SIZE)
    (peer.inbox / FINAL).write_bytes(unknown)
    local, expected = make_export(tmp_path)

    outcome = peer.destination().deliver(
        local,
        expected,
        attempt_id="att-r",
        replacement_of=expected_for(original),
        overwrite_agreed=True,
        record_evidence=Recorder(peer),
    )

    # The overwrite happened, but name and size cannot show it: a rebuilt export has the same size.
    assert isinstance(outcome, Unknown)
    assert (peer.inbox / FINAL).read_bytes() == local.read_bytes()


# -- races and interruptions -----------------------------------------------------------------------


def test_a_file_appearing_between_listing_and_rename_is_never_overwritten_and_the_outcome_is_unknown(
    peer: SftpPeer, tmp_path: Path
) -> None:
    late = b"a paused earlier upload landing late\n"
    local, expected = make_export(tmp_path)
    record = Recorder(peer)
    record.hooks[EvidenceStage.BASELINE] = lambda: (peer.inbox / FINAL).write_bytes(late)

    outcome = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=record)

    # The final name now exists, so a fresh listing cannot match the absent baseline: not NotDelivered.
    assert isinstance(outcome, Unknown)
    assert (peer.inbox / FINAL).read_bytes() == late
    assert record.stages == [EvidenceStage.BASELINE, EvidenceStage.RENAME_REFUSED]
    assert record.evidence[-1].listing.present is True
    assert no_temp_files(peer)


def test_a_file_created_at_the_moment_of_the_rename_is_never_overwritten(
    embedded_sftp: SftpPeer, tmp_path: Path
) -> None:
    peer = embedded_sftp
    assert peer.server is not None
    peer.server.faults.occupy_before_rename = b"landed at the last moment\n"
    local, expected = make_export(tmp_path)

    outcome = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=Recorder(peer))

    assert peer.server.faults.occupied.is_set()
    assert isinstance(outcome, Unknown)
    assert (peer.inbox / FINAL).read_bytes() == b"landed at the last moment\n"


def test_a_connection_cut_mid_upload_leaves_no_final_file_and_the_outcome_follows_the_evidence(
    peer: SftpPeer, tmp_path: Path, fault_proxy
) -> None:
    local, expected = make_export(tmp_path)
    if peer.server is not None:
        peer.server.faults.cut_after_write_bytes = 64 * 1024
        cut = peer.server.faults.cut
        route = peer
        record = Recorder(route)
    else:
        proxy, route = fault_proxy(peer)
        cut = proxy.cut
        record = Recorder(route)
        record.hooks[EvidenceStage.BASELINE] = lambda: proxy.cut_after(64 * 1024)

    outcome = route.destination().deliver(local, expected, attempt_id="att-1", record_evidence=record)

    assert cut.is_set()
    assert not (peer.inbox / FINAL).exists()
    # Proof the rename never ran: stopped before it was sent, and a fresh listing matches the baseline.
    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED
    assert record.stages == [EvidenceStage.BASELINE, EvidenceStage.INTERRUPTED]
    assert no_temp_files(peer)


def test_a_lost_rename_reply_is_unknown_although_the_server_renamed(embedded_sftp: SftpPeer, tmp_path: Path) -> None:
    peer = embedded_sftp
    assert peer.server is not None
    peer.server.faults.drop_rename_reply = True
    local, expected = make_export(tmp_path)
    record = Recorder(peer)

    outcome = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=record)

    assert peer.server.faults.rename_reply_dropped.is_set()
    assert isinstance(outcome, Unknown)
    assert (peer.inbox / FINAL).read_bytes() == local.read_bytes()
    # The fresh listing is kept for reconciliation, which can settle it.
    assert record.stages[-1] is EvidenceStage.INTERRUPTED and record.evidence[-1].listing.present


def test_a_wrong_host_key_is_refused_before_anything_is_sent(peer: SftpPeer, tmp_path: Path) -> None:
    other = _other_host_key_line(peer)
    local, expected = make_export(tmp_path)
    record = Recorder(peer)

    outcome = peer.destination(host_key=other).deliver(local, expected, attempt_id="att-1", record_evidence=record)

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED
    assert "HostKey" in outcome.detail
    assert record.evidence == []
    assert peer.files() == {}


def test_a_hung_server_times_out_within_bounds_and_the_outcome_is_unknown(
    peer: SftpPeer, tmp_path: Path, fault_proxy
) -> None:
    local, expected = make_export(tmp_path)
    quick = {"io_timeout": 1.0, "connect_timeout": 1.0}
    if peer.server is not None:
        peer.server.faults.hang_on = frozenset({"rename"})
        route = peer.with_config(**quick)
        record = Recorder(route)
        hanging = peer.server.faults.hanging
    else:
        proxy, route = fault_proxy(peer.with_config(**quick))
        record = Recorder(route)
        record.hooks[EvidenceStage.BASELINE] = proxy.hold
        hanging = proxy.held

    started = time.monotonic()
    outcome = route.destination().deliver(local, expected, attempt_id="att-1", record_evidence=record)
    elapsed = time.monotonic() - started

    assert hanging.is_set()
    assert isinstance(outcome, Unknown)
    assert "Timeout" in outcome.detail
    assert elapsed < 10


# -- inspection and secrets ------------------------------------------------------------------------


def test_inspect_shows_the_final_names_size_hash_and_acknowledgment(hash_peer: SftpPeer) -> None:
    data = os.urandom(SIZE)
    (hash_peer.inbox / FINAL).write_bytes(data)
    (hash_peer.inbox / ack_name(FINAL)).write_text(hashlib.sha256(data).hexdigest().upper() + "\n")

    listing = hash_peer.destination(acknowledgments=True).inspect(FINAL)
    absent = hash_peer.destination(acknowledgments=True).inspect("never-delivered.csv")

    assert listing.present and listing.size == SIZE
    assert listing.sha256 == hashlib.sha256(data).digest()
    assert listing.ack == hashlib.sha256(data).hexdigest()
    assert listing.proof_for(expected_for(data)) is Proof.CHECKSUM
    assert not absent.present and not absent.occupied


def test_no_secret_appears_in_any_exception_outcome_repr_or_log_record(
    peer: SftpPeer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    local, expected = make_export(tmp_path)
    texts: list[str] = [repr(peer.config), str(peer.config), repr(peer.destination())]
    secrets: tuple[str, ...] = peer.secrets

    delivered = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=Recorder(peer))
    texts.append(repr(delivered))
    wrong_key = peer.destination(host_key=_other_host_key_line(peer)).deliver(
        local, expected, attempt_id="att-2", record_evidence=Recorder(peer)
    )
    texts.append(repr(wrong_key))
    # A credential the server refuses: a wrong password, or a key it does not know.
    refused_env = dict(peer.environ)
    if peer.kind == "embedded":
        refused_env[next(iter(peer.environ))] = peer.secrets[0][::-1]
    else:
        unknown_key = make_client_key(tmp_path / "unknown-key")
        secrets += key_secrets(unknown_key)
        refused_env[next(iter(peer.environ))] = str(unknown_key.private_path)
    refused = Destination(peer.config, environ=refused_env).deliver(
        local, expected, attempt_id="att-3", record_evidence=Recorder(peer)
    )
    texts.append(repr(refused))
    # A key file that does not parse: the library's complaint must not quote it.
    garbled = tmp_path / "garbled_key"
    garbled.write_text("\n".join(("-----BEGIN OPENSSH PRIVATE KEY-----", *secrets, "-----END")) + "\n")
    unreadable = peer.destination(credential_ref=f"keyfile:{garbled}")
    with pytest.raises(CredentialError) as garbled_error:
        unreadable.inspect(FINAL)
    texts.append(str(garbled_error.value))
    with pytest.raises(CredentialError) as missing:
        Destination(peer.config, environ={}).inspect(FINAL)
    texts.append(str(missing.value))

    assert isinstance(delivered, Completed)
    assert isinstance(wrong_key, Failed) and isinstance(refused, Failed)
    assert "Authentication" in refused.detail
    # Each record as a process writes it: the event, its fields (errors travel there) and any traceback.
    texts += [logs.TextFormatter().format(record) for record in caplog.records]
    leaks = [text for text in texts for secret in secrets if secret in text]
    assert leaks == []


def _other_host_key_line(peer: SftpPeer) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    raw = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    keytype, data = raw.decode().split()
    return f"[{peer.config.host}]:{peer.config.port} {keytype} {data}"


def test_temporary_names_are_dot_files_unique_to_the_attempt() -> None:
    assert temp_name(FINAL, "att-1") == f".{FINAL}.att-1.part"
    assert temp_name(FINAL, "att-1") != temp_name(FINAL, "att-2")


# -- completion markers, finished after the fact -------------------------------------------------------


def _marked_expected(data: bytes) -> ExpectedFile:
    return ExpectedFile(FINAL, len(data), hashlib.sha256(data).digest(), marker_name=FINAL + ".done", marker=b"")


def test_a_missing_marker_is_written_only_where_the_file_is_there_as_recorded(peer: SftpPeer) -> None:
    data = b"email\na@example.com\n"
    expected = _marked_expected(data)
    destination = peer.destination()

    absent = destination.complete_marker(expected, "att-1")
    (peer.inbox / FINAL).write_bytes(data + b"changed")
    contradicted = destination.complete_marker(expected, "att-1")
    (peer.inbox / FINAL).write_bytes(data)
    finished = destination.complete_marker(expected, "att-1")

    assert (absent.present, absent.marker) == (False, None)
    assert contradicted.marker is None
    assert finished.marker == hashlib.sha256(b"").hexdigest() and finished.marker_matches(expected)
    assert sorted(peer.files()) == [FINAL, FINAL + ".done"]


def test_a_marker_name_already_taken_is_never_written_over(peer: SftpPeer) -> None:
    data = b"email\na@example.com\n"
    (peer.inbox / FINAL).write_bytes(data)
    (peer.inbox / (FINAL + ".done")).write_bytes(b"someone else's")

    shown = peer.destination().complete_marker(_marked_expected(data), "att-1")

    assert shown.marker == hashlib.sha256(b"someone else's").hexdigest()
    assert (peer.inbox / (FINAL + ".done")).read_bytes() == b"someone else's"
    assert sorted(peer.files()) == [FINAL, FINAL + ".done"]   # no temporary marker either

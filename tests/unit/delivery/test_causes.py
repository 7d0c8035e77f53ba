"""Why the partner could not be used, from the error alone: transient errors defer (and may be retried),
configuration errors fail at once, a refusal by the server is permanent."""

from __future__ import annotations

import paramiko
import pytest

from app.delivery.classifier import Failed, Stage, cause_of, classify
from app.delivery.errors import CredentialError, EvidenceNotRecorded, HostKeyMismatch, UploadMismatch
from app.delivery.evidence import Listing
from app.store.types import FailureCause, FailureCode

TRANSIENT = [
    ConnectionRefusedError(111, "Connection refused"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError("timed out"),
    TimeoutError("the server did not open an SFTP session in time"),
    EOFError(),
    # OpenSSH's MaxStartups drops the connection during the banner or the key exchange.
    paramiko.SSHException("Error reading SSH protocol banner"),
    paramiko.ChannelException(1, "Administratively prohibited"),   # MaxSessions
    paramiko.ssh_exception.NoValidConnectionsError({("127.0.0.1", 22): ConnectionRefusedError(111, "refused")}),
    OSError(113, "No route to host"),
]
CONFIGURATION = [
    HostKeyMismatch("[127.0.0.1]:2222 presented a ssh-rsa host key that is not the pinned key"),
    paramiko.AuthenticationException("Authentication failed."),
    paramiko.BadAuthenticationType("Bad authentication type", ["publickey"]),
    CredentialError("env:PARTNER_PASSWORD is not set"),
]
PERMANENT = [
    PermissionError(13, "Permission denied"),
    OSError("Failure"),                       # an SFTP status reply without an errno
    UploadMismatch("the local file is not the expected file recorded at cutoff 2"),
    EvidenceNotRecorded("the baseline was not recorded"),
    ValueError("unexpected"),
]


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__)
def test_a_connection_that_could_not_be_made_or_did_not_last_is_transient(exc):
    assert cause_of(exc) is FailureCause.TRANSIENT


@pytest.mark.parametrize("exc", CONFIGURATION, ids=lambda e: type(e).__name__)
def test_a_host_key_or_credential_the_partner_refuses_is_a_configuration_error(exc):
    assert cause_of(exc) is FailureCause.CONFIGURATION


def test_a_host_key_paramiko_itself_rejects_is_a_configuration_error():
    got, expected = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)

    assert cause_of(paramiko.BadHostKeyException("[127.0.0.1]:2222", got, expected)) is FailureCause.CONFIGURATION


@pytest.mark.parametrize("exc", PERMANENT, ids=lambda e: type(e).__name__)
def test_a_refusal_by_the_server_or_a_local_fault_is_permanent(exc):
    assert cause_of(exc) is FailureCause.PERMANENT


def test_a_failure_before_any_write_carries_the_cause_of_its_error():
    refused = classify(ConnectionRefusedError(111, "refused"), stage=Stage.CONNECT)
    rejected = classify(paramiko.AuthenticationException("Authentication failed."), stage=Stage.CONNECT)

    assert isinstance(refused, Failed) and (refused.code, refused.cause) == (FailureCode.NOT_DELIVERED,
                                                                           FailureCause.TRANSIENT)
    assert isinstance(rejected, Failed) and rejected.cause is FailureCause.CONFIGURATION


def test_an_upload_cut_by_the_connection_with_the_baseline_unchanged_is_a_transient_non_delivery():
    baseline = Listing(final_name="f.csv", present=False)

    cut = classify(EOFError(), stage=Stage.UPLOAD, baseline=baseline, fresh=Listing(final_name="f.csv", present=False))

    assert isinstance(cut, Failed) and (cut.code, cut.cause) == (FailureCode.NOT_DELIVERED, FailureCause.TRANSIENT)


def test_a_refused_rename_or_a_mismatched_upload_is_a_permanent_non_delivery():
    baseline = Listing(final_name="f.csv", present=False)
    fresh = Listing(final_name="f.csv", present=False)

    refused = classify(OSError("Failure"), stage=Stage.RENAME, baseline=baseline, fresh=fresh, rename_refused=True)
    mismatch = classify(UploadMismatch("not the expected file"), stage=Stage.UPLOAD, baseline=baseline, fresh=fresh)

    assert isinstance(refused, Failed) and refused.cause is FailureCause.PERMANENT
    assert isinstance(mismatch, Failed) and mismatch.cause is FailureCause.PERMANENT

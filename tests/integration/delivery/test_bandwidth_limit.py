"""A destination's bandwidth limit, honoured by the upload loop: the bytes go no faster than the limit, and
a paced upload still takes an asynchronous exception (a worker's shutdown, a time limit) at once, never
after the rest of the file's allowance."""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time
from pathlib import Path

from app.delivery.classifier import Completed
from app.delivery.credentials import resolve_credential
from app.delivery.session import connect
from app.store.types import ExpectedFile
from exports_devtools.waiting import wait_until
from tests.fixtures.sftp import SftpPeer

LIMIT = 32 * 1024


class _Stop(BaseException):
    """Raised in the uploading thread, as dramatiq's shutdown and time limit raise theirs."""


def test_an_upload_goes_no_faster_than_the_destinations_bandwidth_limit(
        embedded_sftp: SftpPeer, tmp_path: Path) -> None:
    data = os.urandom(2 * LIMIT)
    local = tmp_path / "built.csv"
    local.write_bytes(data)
    expected = ExpectedFile("contacts-paced.csv", len(data), hashlib.sha256(data).digest())

    started = time.monotonic()
    outcome = embedded_sftp.destination(bandwidth_limit=LIMIT).deliver(local, expected, attempt_id="att-1",
                                                                      record_evidence=lambda e: None)
    elapsed = time.monotonic() - started

    assert isinstance(outcome, Completed)
    # Its last write may go once all before it fit the allowance: 64 KiB less one 4 KiB write, at 32 KiB/s.
    assert elapsed >= (len(data) - LIMIT // 8) / LIMIT
    assert (embedded_sftp.inbox / expected.name).read_bytes() == data


def test_a_paced_upload_takes_an_asynchronous_exception_between_two_short_waits(
        embedded_sftp: SftpPeer, tmp_path: Path) -> None:
    local = tmp_path / "built.csv"
    local.write_bytes(os.urandom(1024 * 1024))   # over 15 minutes at 1 KiB/s
    config = embedded_sftp.config
    raised: list[BaseException] = []
    ended = threading.Event()

    def upload() -> None:
        try:
            with connect(config, config.pinned_keys(), resolve_credential(config.credential_ref,
                                                                         embedded_sftp.environ)) as session:
                session.upload(local, f"{config.remote_dir}/.paced.part", bandwidth_limit=1024)
        except BaseException as exc:   # the test's own exception, delivered by the interpreter
            raised.append(exc)
        finally:
            ended.set()

    thread = threading.Thread(target=upload)
    thread.start()
    wait_until(lambda: (embedded_sftp.inbox / ".paced.part").exists(), "the paced upload to start", 10)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Stop))

    assert ended.wait(10), "a paced upload kept its thread past the exception"
    thread.join()
    assert len(raised) == 1 and isinstance(raised[0], _Stop)

"""``Encryptor``: an export streamed through one gpg process, encrypted to the partner's keys (and signed by
us), which it starts itself so that it can kill it."""

from __future__ import annotations

import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import gnupg

from app import logs
from app.delivery.errors import EncryptionFailed
from app.delivery.openpgp.gpg import parse_statuses, status_detail
from app.delivery.openpgp.keyrings import KEYRINGS, Keyring
from app.delivery.openpgp.keys import PartnerKey, check_usable
from app.delivery.openpgp.signing import SigningRef

log = logs.get(__name__)


class Encryptor:
    """Streams plaintext chunks into gpg and the ciphertext into ``output`` (a Path). Memory flat in the input
    size: a chunk goes down gpg's stdin pipe, which blocks while gpg catches up, and gpg writes the file.

    Binary output, to every recipient by fingerprint, trusted explicitly (``--trust-model always``: the keys
    were pinned by fingerprint), no compression inside gpg (the caller's file is gzip already), signed by
    ``signer`` when given. One instance is used by one thread, except ``abort``, which any thread may call
    (a stop signal) and which ends a ``write`` blocked on gpg."""

    def __init__(self, output: Path, recipients: Sequence[PartnerKey], *, signer: SigningRef | None = None) -> None:
        keys = tuple(recipients)
        if not keys:
            raise ValueError("an Encryptor needs at least one recipient")
        check_usable(keys)
        self._output = Path(output)
        self._lock = threading.Lock()
        self._state = "running"
        self._status: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._created = False
        self._ring: Keyring | None = KEYRINGS.acquire(keys, signer)
        try:
            home = self._ring.home
            assert home is not None
            args = ["--encrypt", "--trust-model", "always", "--compress-algo", "none"]
            for fingerprint in dict.fromkeys(key.fingerprint for key in keys):
                args += ["--recipient", fingerprint]
            if self._ring.signer is not None:
                args += ["--sign", "--local-user", self._ring.signer]
            self._signed = self._ring.signer is not None
            self._gpg = home.gpg
            self._status = tempfile.TemporaryFile()
            with open(self._output, "wb") as out:
                self._created = True
                self._proc = subprocess.Popen(home.command(args), stdin=subprocess.PIPE, stdout=out,
                                              stderr=self._status, env=home.env)
        except BaseException:
            self._state = "failed"
            self._cleanup(remove_output=True)
            raise

    @property
    def pid(self) -> int | None:
        """The gpg process's id while it may run (for a supervisor, and the tests)."""
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> Encryptor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()

    def write(self, chunk: bytes | bytearray) -> None:
        """Hands gpg the next plaintext; blocks while gpg catches up. EncryptionFailed if gpg died (the output
        is then removed) or the encryption was finished or aborted."""
        proc = self._proc
        if self._state != "running" or proc is None or proc.stdin is None:
            raise EncryptionFailed(f"the encryption is {self._state}: nothing more can be written")
        try:
            proc.stdin.write(chunk)
        except (OSError, ValueError):
            # BrokenPipeError: gpg exited; ValueError: abort() closed the pipe meanwhile.
            with self._lock:
                if self._state != "running":
                    raise EncryptionFailed(f"the encryption was {self._state} while writing") from None
                self._state = "failed"
            returncode = proc.wait()
            message = self._failure(returncode, self._read_statuses(), "gpg stopped reading its input")
            self._cleanup(remove_output=True)
            raise EncryptionFailed(message) from None

    def finish(self) -> None:
        """Ends the input and waits for gpg; the output is complete once this returns. EncryptionFailed (and
        the output removed) when gpg did not report a finished encryption (and signature, when signing)."""
        with self._lock:
            if self._state != "running":
                raise EncryptionFailed(f"the encryption is {self._state}: it cannot be finished")
            self._state = "finishing"
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.close()
        except (OSError, ValueError):
            pass   # gpg exited early: its status says why
        returncode = proc.wait()
        statuses = self._read_statuses()
        words = {word for word, _ in statuses}
        with self._lock:
            aborted = self._state == "aborted"
            ok = not aborted and returncode == 0 and "END_ENCRYPTION" in words and (
                not self._signed or "SIG_CREATED" in words)
            if not aborted:
                self._state = "finished" if ok else "failed"
        if not ok:
            message = "the encryption was aborted" if aborted else self._failure(returncode, statuses, "gpg failed")
            self._cleanup(remove_output=True)
            raise EncryptionFailed(message)
        self._cleanup(remove_output=False)

    def abort(self) -> None:
        """Kills gpg if it runs, waits for it and removes the output (also a finished one). Idempotent; never
        raises."""
        try:
            with self._lock:
                self._state = "aborted"
            proc = self._proc
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                if proc.stdin is not None:
                    try:
                        proc.stdin.close()   # after the kill: a write blocked on the pipe has returned
                    except (OSError, ValueError):
                        pass
            self._cleanup(remove_output=True)
        except Exception as exc:   # an abort runs on error paths: it must not hide the error
            log.warning("openpgp.abort_incomplete", error=type(exc).__name__)

    def _read_statuses(self) -> list[tuple[str, str]]:
        if self._status is None:
            return []
        self._status.seek(0)
        return parse_statuses(self._status.read(1 << 20))

    def _failure(self, returncode: int, statuses: list[tuple[str, str]], what: str) -> str:
        if returncode < 0:
            return f"{what}: gpg was killed by signal {-returncode}"
        summary = gnupg.Crypt(self._gpg)
        for word, value in statuses:
            try:
                summary.handle_status(word, value)
            except Exception:   # a status python-gnupg does not parse
                continue
        said = f"{summary.status}; " if summary.status else ""
        return f"{what} (exit status {returncode}): {said}{status_detail(statuses)}"

    def _cleanup(self, *, remove_output: bool) -> None:
        with self._lock:
            ring, self._ring = self._ring, None
            status, self._status = self._status, None
        if ring is not None:
            KEYRINGS.release(ring)
        if status is not None:
            status.close()
        if remove_output and self._created:
            self._output.unlink(missing_ok=True)

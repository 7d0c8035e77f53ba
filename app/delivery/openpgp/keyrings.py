"""The process's keyring homes: one per set of recipients (and signer), imported once and reused by every
export to them, so an export costs one gpg process. ``forget_keyrings`` removes them (done at exit)."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app import logs
from app.delivery.errors import KeyRefused
from app.delivery.openpgp.gpg import Home
from app.delivery.openpgp.keys import PartnerKey
from app.delivery.openpgp.signing import SigningRef, load_signing_key, read_signing_key, signing_key_path

log = logs.get(__name__)

#: Keyring homes kept per process; the least recently used idle one goes beyond this.
_MAX_HOMES = 32


@dataclass(eq=False)
class Keyring:
    """One cached home: its recipients' keys imported, and our secret key when it signs."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    home: Home | None = None
    signer: str | None = None
    users: int = 0
    broken: bool = False


class _Keyrings:
    """The process's keyring homes, by recipients (fingerprint and key text) and signing key (reference and
    file identity, so a replaced key file takes effect at the next export). Thread-safe: a home is built
    once, by the first export that needs it, while the others to the same recipients wait; exports to
    other recipients go on. At most ``_MAX_HOMES`` idle homes are kept; all are removed at exit."""

    def __init__(self) -> None:
        self._reset()
        atexit.register(self.close)
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # In a forked child the parent's homes stay the parent's: the child builds its own.
        self._lock = threading.Lock()
        self._rings: OrderedDict[tuple[Any, ...], Keyring] = OrderedDict()
        self._root: Path | None = None
        self._pid = os.getpid()

    def acquire(self, keys: Sequence[PartnerKey], signer: SigningRef | None) -> Keyring:
        signer_path = signing_key_path(signer) if signer is not None else None
        signer_id: tuple[Any, ...] | None = None
        if signer is not None and signer_path is not None:
            try:
                found = os.stat(signer_path)
            except OSError:
                raise KeyRefused(f"signing key {signer.shown} cannot be read") from None
            signer_id = (str(signer), signer_path, found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)
        recipients = tuple(sorted({(key.fingerprint, hashlib.sha256(key.armored.encode()).hexdigest())
                                   for key in keys}))
        cache_key = (recipients, signer_id)
        while True:
            with self._lock:
                ring = self._rings.get(cache_key)
                if ring is None:
                    ring = self._rings[cache_key] = Keyring()
                self._rings.move_to_end(cache_key)
                ring.users += 1
            with ring.lock:
                if ring.home is not None:
                    break
                if ring.broken:   # the build this thread waited for failed: try again with a new entry
                    self.release(ring)
                    continue
                try:
                    ring.home, ring.signer = self._build(keys, signer, signer_path)
                except BaseException:
                    ring.broken = True
                    with self._lock:
                        ring.users -= 1
                        if self._rings.get(cache_key) is ring:
                            del self._rings[cache_key]
                    raise
                break
        self._evict()
        return ring

    def release(self, ring: Keyring) -> None:
        with self._lock:
            ring.users -= 1

    def _build(self, keys: Sequence[PartnerKey], signer: SigningRef | None,
               signer_path: str | None) -> tuple[Home, str | None]:
        with self._lock:
            if self._root is None:
                # 0700; the pid says whose it is (an agent outliving a killed worker is found by it).
                self._root = Path(tempfile.mkdtemp(prefix=f"exports-openpgp-{os.getpid()}-"))
            root = self._root
        path = Path(tempfile.mkdtemp(prefix="k", dir=root))
        try:
            home = Home(path, agent=signer is not None)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        try:
            home.run(["--import"], "\n".join(key.armored for key in keys).encode())
            found = {str(listed.get("fingerprint")) for listed in home.gpg.list_keys()}
            expected = {key.fingerprint for key in keys}
            if missing := sorted(expected - found):
                raise KeyRefused(f"stored partner key {missing[0]} does not hold the key its fingerprint names")
            if found != expected:
                raise KeyRefused(f"stored partner keys hold a key no fingerprint names ({sorted(found - expected)[0]})")
            signer_fpr = None
            if signer is not None and signer_path is not None:
                signer_fpr = load_signing_key(home, signer, read_signing_key(signer, signer_path))
        except BaseException:
            home.remove()
            raise
        log.info("openpgp.keyring_built", recipients=",".join(sorted(expected)), signed=signer is not None)
        return home, signer_fpr

    def _evict(self) -> None:
        evicted = []
        with self._lock:
            idle = [key for key, ring in self._rings.items() if ring.users == 0 and ring.home is not None]
            while len(self._rings) > _MAX_HOMES and idle:
                evicted.append(self._rings.pop(idle.pop(0)))
        for ring in evicted:
            if ring.home is not None:
                ring.home.remove()

    def close(self) -> None:
        """Removes every home (stopping their agents) and the private directory. Exports still running
        fail; at exit there are none."""
        with self._lock:
            if self._pid != os.getpid():
                return
            rings, root = list(self._rings.values()), self._root
            self._rings.clear()
            self._root = None
        for ring in rings:
            if ring.home is not None:
                ring.home.remove()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


KEYRINGS = _Keyrings()


def forget_keyrings() -> None:
    """Removes the process's cached keyring homes and stops their gpg-agents (done at exit; tests call it)."""
    KEYRINGS.close()

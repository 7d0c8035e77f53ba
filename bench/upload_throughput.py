"""Delivery of one large file to a real OpenSSH server against OpenSSH's own sftp client, same cipher.

Ours is ``Destination.deliver`` on a warm session (a ``SessionPool`` that delivered before): the
health check, the baseline listing, the upload under a temporary name with its SHA-256, the stat, the
no-overwrite rename and the read-back of the final name. Against, with the cipher and MAC paramiko
negotiates forced on the client (``sftp -c ... -o MACs=...``; the server offers both):

- OpenSSH ``sftp -b`` putting the same file, its handshake left out: ``-v`` prints a line when the
  session asks for the sftp subsystem (key exchange and authentication are done by then), which is
  stamped as it arrives; the transfer is from that line to the client's exit. The same batch without
  the put is timed too: the handshake and exit alone, which a whole ``sftp`` run pays on top.
- paramiko writing the same file on a warm session, pipelined, nothing else: where the difference
  between ours and OpenSSH lies, paramiko or the delivery around it.

Needs root (sshd on loopback) and /usr/sbin/sshd.

    python -m bench.upload_throughput [--megabytes 59] [--runs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.delivery.config import DestinationConfig
from app.delivery.credentials import resolve_credential
from app.delivery.destination import Destination
from app.delivery.session import CHUNK_SIZE, open_session
from app.delivery.sessions import SessionPool
from app.store.types import ExpectedFile


def negotiated(config: DestinationConfig, environ: Mapping[str, str]) -> tuple[str, str]:
    """The cipher and MAC a product session to this partner uses (client to server)."""
    session = open_session(config, config.pinned_keys(), resolve_credential(config.credential_ref, environ))
    try:
        transport = session.client.get_transport()
        assert transport is not None
        return transport.local_cipher, transport.local_mac
    finally:
        session.close()


class WarmDelivery:
    """``Destination.deliver`` through a pool that keeps its session warm between deliveries."""

    def __init__(self, config: DestinationConfig, environ: Mapping[str, str]) -> None:
        self.destination = Destination(config, environ=environ)
        self.pool = SessionPool(max_idle=1)
        self.sessions = self.pool.for_destination(uuid.uuid4())

    def deliver(self, local: Path, size: int, sha256: bytes) -> tuple[float, str]:
        """Seconds for one delivery of ``local`` under a fresh final name, and that name."""
        expected = ExpectedFile(f"contacts-{uuid.uuid4().hex}.csv", size, sha256)
        started = time.perf_counter()
        outcome = self.destination.deliver(local, expected, attempt_id=str(uuid.uuid4()),
                                           record_evidence=lambda evidence: None, sessions=self.sessions)
        elapsed = time.perf_counter() - started
        if outcome.status != "Completed":
            raise RuntimeError(f"the delivery ended {outcome.status}")
        return elapsed, expected.name

    def close(self) -> None:
        self.pool.close()


class WarmParamiko:
    """A paramiko SFTP session kept open; ``put`` writes a file on it, pipelined, and nothing else."""

    def __init__(self, config: DestinationConfig, environ: Mapping[str, str]) -> None:
        self.config = config
        self.session = open_session(config, config.pinned_keys(), resolve_credential(config.credential_ref, environ))

    def put(self, local: Path) -> tuple[float, str]:
        name = f"paramiko-{uuid.uuid4().hex}.csv"
        started = time.perf_counter()
        with local.open("rb") as source, self.session.sftp.open(f"{self.config.remote_dir}/{name}", "wb") as remote:
            remote.set_pipelined(True)
            while chunk := source.read(CHUNK_SIZE):
                remote.write(chunk)
        return time.perf_counter() - started, name

    def close(self) -> None:
        self.session.close()


@dataclass(frozen=True)
class SftpRun:
    #: From the client's start to its exit.
    total: float
    #: From the subsystem request (key exchange and authentication done) to the client's exit.
    after_handshake: float
    #: The cipher and MAC the client negotiated, as ``ssh -v`` says.
    negotiated: str


def sftp_run(config: DestinationConfig, key_file: str, batch_text: str, work: Path, *, cipher: str,
             mac: str) -> SftpRun:
    """One ``sftp -v -b`` run of ``batch_text``, with the pinned host key and the forced cipher and MAC."""
    known_hosts = work / "known_hosts"
    known_hosts.write_text(config.host_key + "\n")
    batch = work / f"batch-{uuid.uuid4().hex}"
    batch.write_text(batch_text)
    command = ["sftp", "-v", "-b", str(batch), "-P", str(config.port), "-i", key_file, "-c", cipher,
               "-o", f"MACs={mac}", "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
               "-o", "BatchMode=yes", f"{config.username}@{config.host}"]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    handshake_done = None
    chosen = ""
    tail: list[str] = []
    for raw in process.stderr:
        line = raw.decode(errors="replace").rstrip()
        if handshake_done is None and "Sending subsystem: sftp" in line:
            handshake_done = time.perf_counter()
        if "kex: client->server cipher:" in line:
            chosen = line.split("cipher:", 1)[1].strip()
        tail = [*tail[-20:], line]
    code = process.wait()
    ended = time.perf_counter()
    batch.unlink()
    if code != 0 or handshake_done is None:
        raise RuntimeError(f"sftp exited with {code}: " + " | ".join(tail[-5:]))
    return SftpRun(ended - started, ended - handshake_done, chosen)


def sftp_put(config: DestinationConfig, key_file: str, local: Path, work: Path, *, cipher: str,
             mac: str) -> tuple[SftpRun, str]:
    name = f"sftp-{uuid.uuid4().hex}.csv"
    return sftp_run(config, key_file, f"put {local} {config.remote_dir}/{name}\n", work, cipher=cipher, mac=mac), name


def sftp_handshake(config: DestinationConfig, key_file: str, work: Path, *, cipher: str, mac: str) -> SftpRun:
    """The same client with an empty batch: connect, key exchange, authenticate, exit."""
    return sftp_run(config, key_file, "", work, cipher=cipher, mac=mac)


def main() -> None:
    from tests.fixtures.sftp import KEYFILE_ENV, running_openssh

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=59)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_openssh(Path(tmp) / "openssh") as peer:
        work = Path(tmp)
        local = work / "export.csv"
        local.write_bytes(os.urandom(args.megabytes * 1024 * 1024))
        data = local.read_bytes()
        size, sha = len(data), hashlib.sha256(data).digest()
        cipher, mac = negotiated(peer.config, peer.environ)
        key_file = peer.environ[KEYFILE_ENV]
        ours, bare = WarmDelivery(peer.config, peer.environ), WarmParamiko(peer.config, peer.environ)
        ours.deliver(local, size, sha)   # warm-up: the pool's session
        best = {"ours": float("inf"), "paramiko": float("inf"), "sftp": float("inf"), "handshake": float("inf")}
        chosen = ""
        for _ in range(args.runs):
            best["ours"] = min(best["ours"], ours.deliver(local, size, sha)[0])
            best["paramiko"] = min(best["paramiko"], bare.put(local)[0])
            run, _ = sftp_put(peer.config, key_file, local, work, cipher=cipher, mac=mac)
            best["sftp"], chosen = min(best["sftp"], run.after_handshake), run.negotiated
            best["handshake"] = min(best["handshake"], sftp_handshake(peer.config, key_file, work, cipher=cipher,
                                                                      mac=mac).total)
        ours.close()
        bare.close()
    mib = size / 2**20
    print(f"{mib:.0f} MiB to OpenSSH on loopback, paramiko's {cipher} + {mac} (sftp: {chosen}), best of {args.runs}:")
    print(f"  OpenSSH sftp, handshake left out: {best['sftp']:6.2f} s  {mib / best['sftp']:7.1f} MiB/s")
    print(f"  paramiko alone, warm session:     {best['paramiko']:6.2f} s  {mib / best['paramiko']:7.1f} MiB/s")
    print(f"  Destination.deliver, warm:        {best['ours']:6.2f} s  {mib / best['ours']:7.1f} MiB/s")
    print(f"  sftp's handshake and exit alone:  {best['handshake']:6.2f} s")
    print(f"  ratio ours / sftp:                {best['sftp'] / best['ours']:6.2f}")


if __name__ == "__main__":
    main()

"""Delivery to a real OpenSSH server against the OpenSSH sftp client putting the same file.

Starts sshd on loopback (Debian's openssh-server, as the tests do), then delivers one file of
--megabytes through Destination.deliver (baseline listing, upload under a temporary name, no-overwrite
rename, read-back of the size) and puts the same file with `sftp -b`, alternating, best of --runs
each; reports the ratio. Needs root (sshd) and /usr/sbin/sshd.

    python -m bench.upload_throughput [--megabytes 64] [--runs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from app.delivery.destination import Destination
from app.store.types import ExpectedFile
from tests.fixtures.sftp import KEYFILE_ENV, running_openssh


def deliver_once(peer, local: Path) -> float:
    """Seconds for one Destination.deliver of ``local`` under a fresh final name."""
    data = local.read_bytes()
    expected = ExpectedFile(f"contacts-{uuid.uuid4().hex}.csv", len(data), hashlib.sha256(data).digest())
    started = time.perf_counter()
    outcome = Destination(peer.config, environ=peer.environ).deliver(
        local, expected, attempt_id=str(uuid.uuid4()), record_evidence=lambda evidence: None)
    elapsed = time.perf_counter() - started
    assert outcome.status == "Completed", outcome
    return elapsed


def sftp_put_once(peer, local: Path, work: Path) -> float:
    """Seconds for the OpenSSH sftp client to put ``local`` (batch mode, the peer's key, its pinned host key)."""
    known_hosts = work / "known_hosts"
    known_hosts.write_text(peer.config.host_key + "\n")
    batch = work / "batch"
    batch.write_text(f"put {local} {peer.config.remote_dir}/sftp-{uuid.uuid4().hex}.csv\n")
    started = time.perf_counter()
    subprocess.run(
        ["sftp", "-q", "-b", str(batch), "-P", str(peer.config.port), "-i", peer.environ[KEYFILE_ENV],
         "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
         f"{peer.config.username}@{peer.config.host}"],
        check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_openssh(Path(tmp) / "openssh") as peer:
        local = Path(tmp) / "export.csv"
        local.write_bytes(os.urandom(args.megabytes * 1024 * 1024))
        ours = theirs = float("inf")
        for _ in range(args.runs):
            ours = min(ours, deliver_once(peer, local))
            theirs = min(theirs, sftp_put_once(peer, local, Path(tmp)))
    mb = args.megabytes
    print(f"delivery of {mb} MiB to OpenSSH on loopback (best of {args.runs}):")
    print(f"  OpenSSH sftp put (ceiling):     {theirs:6.2f} s  {mb / theirs:7.1f} MiB/s")
    print(f"  Destination.deliver (ours):     {ours:6.2f} s  {mb / ours:7.1f} MiB/s")
    print(f"  ratio ours / ceiling:           {theirs / ours:6.2f}")


if __name__ == "__main__":
    main()

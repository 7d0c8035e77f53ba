"""Fetching a host key from a real peer gives the line the destination pins for it."""

from __future__ import annotations

import pytest

from app.delivery.hostkeys import fetch_host_key, fingerprint, known_hosts_line, parse_host_key
from tests.fixtures.sftp import SftpPeer

PEERS = [
    pytest.param("embedded_sftp", id="embedded"),
    pytest.param("openssh_sftp", id="openssh", marks=pytest.mark.openssh),
]


@pytest.fixture(params=PEERS)
def peer(request: pytest.FixtureRequest) -> SftpPeer:
    return request.getfixturevalue(request.param)


def test_the_fetched_key_is_the_one_the_destination_pins(peer: SftpPeer) -> None:
    config = peer.config

    key = fetch_host_key(config.host, config.port, timeout=5.0)

    assert known_hosts_line(config.host, config.port, key) == config.host_key
    assert fingerprint(key) == fingerprint(parse_host_key(config.host_key, config.host, config.port).key)

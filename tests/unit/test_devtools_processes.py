"""The process harness finds the process behind a loopback connection, which the chaos soak uses to kill
exactly the worker whose database connection it holds."""

from __future__ import annotations

import os
import socket

from exports_devtools.processes import pid_of_client_port


def test_the_process_holding_a_loopback_client_socket_is_found_by_its_port():
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as client:
            port = client.getsockname()[1]
            assert pid_of_client_port(port) == os.getpid()


def test_a_port_no_socket_holds_names_no_process():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert pid_of_client_port(port) is None

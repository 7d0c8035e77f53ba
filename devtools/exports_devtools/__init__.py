"""Test equipment shared by the demo, the tests and the chaos soak: never imported by the product.

- ``waiting``: ``wait_until``, the one poll for a fact with a bound.
- ``processes``: long-running ``exports`` processes with logs, stopped with a signal and a bound.
- ``tcp_proxy``: a loopback link that holds, cuts or refuses connections; ``pgproxy`` frames the
  PostgreSQL protocol on it to lose a named statement's reply.
- ``sftp_server`` (with ``sftp_subsystem``, and ``sftp_faults`` for its fault hooks): the embedded
  partner SFTP server; ``partner`` runs it as the demo's subprocess.
- ``demo``: ``exports demo``, the whole system through a scripted scenario.
- ``chaos``: ``exports chaos``, the whole system under load and many faults at once, then every
  promise checked (docs/reliability.md).
"""

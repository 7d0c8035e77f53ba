"""What the outbox's NOTIFY costs job creation, measured against the same creations without it.

NOTIFY takes a global lock at commit, so design.md keeps it off the claim and renewal paths and asks
for a measurement where it remains. The outbox insert trigger (tr_outbox_notify) fires on creation,
terms edits, requeues and sweeps; this runs the real creation statement from several clients with
the trigger enabled and disabled, alternating, in one run, and reports the ratio.

    python -m bench.notify_cost [--clients 4] [--creations 1000]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid

import psycopg
from psycopg import sql

from app.store.database import connect
from app.store.types import Role
from bench import system
from bench._scratch import base_url, create, drop, tenant_with_destination


def run(url: str, clients: int, creations: int, tenant: uuid.UUID, destination: uuid.UUID) -> float:
    barrier = threading.Barrier(clients + 1)

    def client() -> None:
        conn = connect(url, Role.APP)
        barrier.wait()
        for _ in range(creations):
            system.create_export(conn, tenant, destination)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return clients * creations / (time.perf_counter() - started)


def set_trigger(owner: psycopg.Connection, enabled: bool) -> None:
    owner.execute(sql.SQL("ALTER TABLE outbox {} TRIGGER tr_outbox_notify").format(
        sql.SQL("ENABLE" if enabled else "DISABLE")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--creations", type=int, default=1000, help="creations per client per run")
    args = parser.parse_args()
    base = base_url()
    name = f"exports_bench_notify_{os.getpid()}"
    url = create(base, name)
    with psycopg.connect(url, autocommit=True) as owner:
        tenant, destination = tenant_with_destination(owner)
        rates: dict[bool, float] = {True: 0.0, False: 0.0}
        # Alternating and best-of-two, so neither side gains from the order.
        for notify in (True, False, False, True):
            set_trigger(owner, notify)
            owner.execute("CHECKPOINT")
            rates[notify] = max(rates[notify], run(url, args.clients, args.creations, tenant, destination))
        set_trigger(owner, True)
    drop(base, name)
    print(f"job creation: {args.clients} clients x {args.creations}")
    print(f"  without the outbox NOTIFY (ceiling): {rates[False]:10.0f} creations/s")
    print(f"  with it (as shipped):                {rates[True]:10.0f} creations/s")
    print(f"  ratio with / without:                {rates[True] / rates[False]:10.2f}")


if __name__ == "__main__":
    main()

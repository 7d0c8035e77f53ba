"""The demo's scenes, in the order they play, then the outcome: each holds the system at a point
with a real resource (the paused relay, a lock on contacts, the held link to the partner, a killed
worker) and shows what the protocol does there."""

from __future__ import annotations

import hashlib
import os
import signal

from app.cli.common import EXIT_REFUSED
from exports_devtools.demo.harness import (
    DEMO_SETTINGS,
    OPERATOR,
    TENANT,
    Demo,
    DemoFailed,
    heading,
    say,
)

#: Client-to-server bytes the link lets through before it holds in the too-late scene: the SSH
#: handshake, authentication and the baseline listing take a few kilobytes, the export of the demo's
#: contacts hundreds.
UPLOAD_HOLD_AFTER_BYTES = 64 * 1024


def delivered(demo: Demo) -> None:
    heading("1. Two exports, delivered")
    jobs = [demo.create(), demo.create()]
    for job_id in jobs:
        demo.wait_status(job_id, "Completed", timeout=90)


def canceled_while_queued(demo: Demo) -> None:
    heading("2. Canceled while queued")
    say("  The relay is paused (SIGSTOP), so the new export's wake-up waits in the outbox.")
    with demo.relay_paused():
        job_id = demo.create()
        demo.cancel(job_id, "wrong segment")
    say("  The relay resumes and publishes the wake-up; the worker finds the export Canceled and does nothing.")
    demo.wait_for("a worker to receive the wake-up", lambda: demo.processed(job_id))
    say(f"  -> export {job_id[:8]} is {demo.status(job_id)}, nothing sent")


def stopped_while_building(demo: Demo) -> None:
    heading("3. Stopped while building")
    say("  The contacts table is locked, so the build waits where a slow query would.")
    with demo.builds_held():
        job_id = demo.create()
        demo.wait_status(job_id, "Running")
        demo.wait_for("the build to be reading contacts", demo.build_waiting_on_lock)
        say("  The worker claimed it and is building. Cancel:")
        demo.cancel(job_id, "customer withdrew")
        say("  The stop request reaches the worker (LISTEN/NOTIFY), which cancels its query and stops.")
        demo.wait_status(job_id, "Stopped")


def too_late(demo: Demo) -> None:
    heading("4. Too late: canceled during delivery")
    assert demo.link is not None
    say("  The link to the partner will be held part way into the upload, after delivery was authorized.")
    # The worker reaches the partner before cutoff 2 (session, baseline listing): the hold must let
    # that through and catch the upload, which is far larger.
    demo.link.hold_after(UPLOAD_HOLD_AFTER_BYTES)
    try:
        job_id = demo.create("partner-slow-link")
        demo.wait_status(job_id, "Delivering")
        demo.cancel(job_id, "too slow")
    finally:
        demo.link.release()
    say("  The request is recorded, not obeyed: the link opens and the file is delivered.")
    demo.wait_status(job_id, "Completed")


def edited(demo: Demo) -> None:
    heading("5. A terms edit while queued, and a stale edit refused")
    with demo.relay_paused():
        job_id = demo.create()
        demo.exports("edit", job_id, "--tenant", TENANT, "--destination", "partner-archive",
                     "--expected-version", "1", "--by", OPERATOR)
        say("  A second operator, still looking at version 1:")
        demo.exports("edit", job_id, "--tenant", TENANT, "--destination", "partner",
                     "--expected-version", "1", "--by", OPERATOR, expect=EXIT_REFUSED)
    demo.wait_status(job_id, "Completed")
    say("  Delivered to /archive under the edited terms (version 2).")


def worker_killed(demo: Demo) -> None:
    heading("6. A worker killed (SIGKILL) mid-build, recovered by the scheduler")
    with demo.builds_held():
        job_id = demo.create()
        demo.wait_status(job_id, "Running")
        demo.wait_for("the build to be reading contacts", demo.build_waiting_on_lock)
        pid = int(demo.show(job_id)["job"]["claimed_by"].split(":")[1])
        owner = demo.worker_of(pid)
        say(f"  {owner.name} (process {pid}) is building it. kill -KILL {pid}")
        os.kill(pid, signal.SIGKILL)
    demo.wait_for(f"{owner.name} to exit", lambda: owner.code is not None, timeout=30)
    say(f"  {owner.name} is gone; its lease runs out in {DEMO_SETTINGS['EXPORTS_LEASE_SECONDS']}s "
        "and nobody renews it.")
    demo.wait_for("recovery to requeue it", lambda: "RequeuedByRecovery" in demo.events(job_id))
    say("  -> the scheduler's recovery took the expired attempt over and requeued it (a new wake-up)")
    replacement = demo.start_worker()
    say(f"  (restarting a worker as {replacement.name}, pid {replacement.pid})")
    demo.wait_status(job_id, "Completed")
    say(f"  events: {' -> '.join(demo.events(job_id))}")
    demo.save_state()


SCENES = (delivered, canceled_while_queued, stopped_while_building, too_late, edited, worker_killed)


def outcome(demo: Demo) -> None:
    heading("The exports")
    demo.exports("list", "--tenant", TENANT)
    heading("The partner's directory")
    assert demo.partner is not None
    completed = demo.exports_json("list", "--tenant", TENANT, "--status", "Completed", show=False)
    recorded = {}
    for listed in completed:
        job = demo.show(listed["job_id"])["job"]
        recorded[job["expected_file_name"]] = job["expected_file_sha256"]
    files = sorted(p for p in demo.partner.root.rglob("*") if p.is_file())
    unexpected = []
    for path in files:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        matches = recorded.get(path.name) == digest
        if not matches:
            unexpected.append(path.name)
        say(f"  /{path.relative_to(demo.partner.root)}  {path.stat().st_size:>8} bytes  "
            + ("matches its export's recorded sha256" if matches else "UNEXPECTED"))
    say(f"  {len(completed)} exports Completed, {len(files)} files at the partner: each delivered exactly once.")
    if unexpected or len(files) != len(completed):
        raise DemoFailed(f"the partner's files do not match the Completed exports one for one: {unexpected}")

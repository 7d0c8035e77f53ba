"""``exports chaos``: the whole system under sustained load and many faults at once, then a check of
every promise.

1. ``ChaosSystem`` starts the services (embedded, or a configured server where the soak makes its own
   database), the partner, the proxy in front of the database, the relay, two workers and the
   scheduler, with short leases.
2. The ``Workload`` creates exports at ``rate`` per second; its operators cancel (double clicks
   included), edit, replace and reconcile at random moments.
3. One thread per fault kind injects that fault at seeded random intervals (``faults_per_minute``
   over all kinds, more often for the kinds that wait for their moment); each injection records what
   it kept from working, so the ``LivenessWatch`` that samples the database every few seconds does not
   blame the system for a wait a fault imposed.
4. After ``minutes``, the faults and the workload stop; the system settles (up to ``settle_minutes``)
   until nothing is Queued, Running or Delivering and the outbox has drained; the scavenger runs.
5. The ``checker`` reads the database and the partner's directory; the report (JSON) lists faults by
   kind, exports by final state and every violation with the export's full history. Exit 0 only with
   no violation.

The same seed draws the same schedule of creations, operator actions and faults; the interleaving
with the processes is the machine's, so a seed reproduces a run's shape, not its every step.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.config import Settings
from app.maintenance.scavenger import Scavenger, ScavengerConfig
from app.store.database import Database
from app.store.types import Role
from exports_devtools.chaos import checker
from exports_devtools.chaos.faults import KINDS, LASTING_KINDS, WAITING_KINDS, Fault
from exports_devtools.chaos.record import Injection, Ledger, Violation
from exports_devtools.chaos.system import CHAOS_SETTINGS, ChaosSystem
from exports_devtools.chaos.watch import LivenessWatch
from exports_devtools.chaos.workload import Target, Workload
from exports_devtools.store import chaos
from exports_devtools.store.owner import connect_owner
from exports_devtools.waiting import TimedOut, wait_until

#: Seconds between two progress lines.
PROGRESS_SECONDS = 10.0
#: Seconds between two looks of the liveness watch.
WATCH_SECONDS = 2.0
#: Statuses an export may not be left in once the system has settled.
UNSETTLED = ("Queued", "Running", "Delivering")


@dataclass(frozen=True)
class SoakOptions:
    minutes: float
    rate: float
    seed: int
    faults_per_minute: float
    settle_minutes: float
    grace_seconds: float
    kinds: tuple[str, ...] = tuple(KINDS)
    database_url: str | None = None
    broker_url: str | None = None
    report_path: Path | None = None
    #: Both destinations deliver gzip + OpenPGP + a manifest (needs gpg).
    partner_files: bool = False
    #: Past ``minutes``, the kinds injected fewer times than this go on (the others stop), up to
    #: ``max_minutes`` in all: a loaded machine makes fewer moments for the kinds that wait for one.
    at_least: int = 0
    max_minutes: float | None = None


@dataclass
class Soak:
    options: SoakOptions
    settings: Settings
    injections: list[Injection] = field(default_factory=list)
    missed: Counter[str] = field(default_factory=Counter)
    fault_errors: Counter[str] = field(default_factory=Counter)
    ledger: Ledger = field(default_factory=Ledger)
    workload_errors: Counter[str] = field(default_factory=Counter)
    unanswered: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def injected(self) -> list[Injection]:
        with self._lock:
            return list(self.injections)

    # -- the run ------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        options = self.options
        started = time.time()
        # The partner runs in this process: a session the soak cut on purpose is not news on stderr.
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)
        say(f"chaos: seed {options.seed}, {options.minutes:g} min at {options.rate:g} exports/s, "
            f"{options.faults_per_minute:g} faults/min over {len(options.kinds)} kinds")
        with ChaosSystem(self.settings, database_url=options.database_url, broker_url=options.broker_url,
                         partner_files=options.partner_files, schedules=True, say=say) as system:
            say(f"  system up: database {system.database}, logs in {system.log_dir}")
            violations = self._soak(system)
            if self.workload_errors:
                violations.append(Violation("soak-error", None, "the soak's own operators failed: "
                                            + "; ".join(f"{k} x{n}" for k, n in self.workload_errors.items())))
            report = self._report(system, violations, started)
        return report

    def _soak(self, system: ChaosSystem) -> list[Violation]:
        options = self.options
        seeds = random.Random(options.seed)
        assert system.tenant_id is not None, "the system made its tenant when it started"
        partner_dirs = {d: system.partner_root / remote.strip("/") for d, remote in system.remote_dirs.items()}
        workload = Workload(Target(system.app_url, system.tenant_id, tuple(system.destination_ids), partner_dirs),
                            options.rate, random.Random(seeds.random()), self.ledger, threading.Event())
        watch = LivenessWatch(lambda: connect_owner(system.owner_url), self.injected,
                              recovery_interval=float(CHAOS_SETTINGS["EXPORTS_RECOVERY_INTERVAL"]),
                              sweep_after=float(CHAOS_SETTINGS["EXPORTS_SWEEP_AFTER"]),
                              sweep_interval=float(CHAOS_SETTINGS["EXPORTS_SWEEP_INTERVAL"]),
                              grace=options.grace_seconds,
                              history=lambda conn, job_id: checker.job_history(
                                  conn, job_id, system.partner_root, system.remote_dir))
        stops = {kind: threading.Event() for kind in options.kinds}
        watch_stop = threading.Event()
        mean_interval = 60.0 * len(options.kinds) / options.faults_per_minute
        def interval(kind: str) -> float:
            return mean_interval / WAITING_KINDS.get(kind, 1.0) * LASTING_KINDS.get(kind, 1)

        fault_threads = [threading.Thread(target=self._fault_loop,
                                          args=(system, KINDS[kind], random.Random(seeds.random()), interval(kind),
                                                stops[kind]),
                                          name=f"chaos-fault-{kind}-{n}", daemon=True)
                         for kind in options.kinds for n in range(LASTING_KINDS.get(kind, 1))]
        watcher = threading.Thread(target=self._watch_loop, args=(system, watch, watch_stop), daemon=True,
                                   name="chaos-watch")
        workload.start()
        for thread in fault_threads:
            thread.start()
        watcher.start()
        started = time.monotonic()
        end = started + options.minutes * 60
        last = started + max(options.minutes, options.max_minutes or 0.0) * 60
        try:
            while (now := time.monotonic()) < end or (now < last and self._short_kinds(stops)):
                until = end if now < end else last
                time.sleep(min(PROGRESS_SECONDS, max(0.0, until - time.monotonic())))
                self._progress(system, "soak" if time.monotonic() < end else "soak, until each kind is injected")
        finally:
            for stop in stops.values():
                stop.set()
            workload.stop_creating()
            for thread in fault_threads:
                thread.join(120)
        self.workload_errors.update(workload.errors)
        self.unanswered.update(workload.unanswered)
        say("  faults and workload stopped; settling")
        system.ensure_running()
        system.pause_schedules()
        settled = self._settle(system)
        watch_stop.set()
        watcher.join(60)
        self._scavenge(system)
        with connect_owner(system.owner_url) as conn:
            found = checker.check(conn, partner_root=system.partner_root, remote_dir=system.remote_dir,
                                  partner_renames=system.partner_renames(), work_dirs=system.work_dirs,
                                  ledger=self.ledger, webhooks_received=system.receiver.delivered()
                                  if system.receiver is not None else None)
        found += self._unverified(system)
        if not settled:
            say("  the system did not settle in time; the checker names what was left")
        return [*watch.violations, *found]

    def _short_kinds(self, stops: dict[str, threading.Event]) -> list[str]:
        """The kinds still injected fewer than ``at_least`` times; the others' loops are told to stop."""
        counts = Counter(i.kind for i in self.injected())
        short = [kind for kind in stops if counts[kind] < self.options.at_least]
        for kind, stop in stops.items():
            if kind not in short:
                stop.set()
        return short

    @staticmethod
    def _unverified(system: ChaosSystem) -> list[Violation]:
        """A request the receiver got whose signature did not verify: the notifier signed it wrong."""
        received = system.receiver.received() if system.receiver is not None else []
        bad = [r for r in received if not r.verified]
        return [Violation("webhook-unverified", None, f"{len(bad)} of {len(received)} webhook requests did not "
                          f"verify: {sorted({r.problem or '' for r in bad})}")] if bad else []

    def _fault_loop(self, system: ChaosSystem, fault: Fault, rng: random.Random, mean_interval: float,
                    stop: threading.Event) -> None:
        """Injects ``fault`` at seeded intervals between half and one and a half times ``mean_interval``
        (not a Poisson process: its counts would scatter too widely for a run that must reach a number
        of every kind). An injection that
        took longer than the gap to the next time (a fault that waited for its moment, or lasted past
        a lease) is followed at once by the next, but the backlog is at most one interval: a kind that
        waits for deliveries must not stay armed for good and fault every one of them."""
        due = time.monotonic()
        while True:
            due = max(due + rng.uniform(0.5, 1.5) * mean_interval, time.monotonic() - mean_interval)
            if stop.wait(max(0.0, due - time.monotonic())):
                return
            try:
                injection = fault.inject(system, rng, stop)
            except Exception as exc:   # an injector's own failure is reported, not a system violation
                with self._lock:
                    self.fault_errors[fault.kind] += 1
                say(f"  fault {fault.kind} could not be injected: {type(exc).__name__}: {exc}")
                continue
            with self._lock:
                if injection is None:
                    self.missed[fault.kind] += 1
                else:
                    self.injections.append(injection)

    def _watch_loop(self, system: ChaosSystem, watch: LivenessWatch, stop: threading.Event) -> None:
        while not stop.wait(WATCH_SECONDS):
            system.ensure_running()
            try:
                watch.sample(time.time())
            except Exception as exc:   # the database may be restarting under a fault: look again later
                say(f"  liveness watch skipped a look: {type(exc).__name__}")

    def _settle(self, system: ChaosSystem) -> bool:
        def quiet() -> bool:
            with connect_owner(system.owner_url) as conn:
                counts = chaos.counts_by_status(conn)
                return (not any(counts.get(s) for s in UNSETTLED) and chaos.unpublished_outbox(conn) == 0
                        and chaos.pending_webhooks(conn) == 0)

        deadline = time.monotonic() + self.options.settle_minutes * 60
        while time.monotonic() < deadline:
            try:
                wait_until(quiet, "the system to settle", min(PROGRESS_SECONDS, deadline - time.monotonic()),
                           interval=1.0)
                self._progress(system, "settled")
                return True
            except TimedOut:
                self._progress(system, "settling")
        return False

    def _scavenge(self, system: ChaosSystem) -> None:
        """The scavenger's pass over every worker's directory, once the system is quiet: what it leaves
        is an orphan."""
        db = Database(system.app_url, Role.APP)
        try:
            for work_dir in system.work_dirs:
                Scavenger(db, ScavengerConfig(work_dir=work_dir)).run_once()
        finally:
            db.close()

    # -- output -------------------------------------------------------------------------------------

    def _progress(self, system: ChaosSystem, phase: str) -> None:
        try:
            with connect_owner(system.owner_url) as conn:
                counts = chaos.counts_by_status(conn)
        except Exception as exc:   # the database may be down under a fault
            counts = {"(unreadable)": 0}
            say(f"  progress: database unreadable ({type(exc).__name__})")
        injected = self.injected()
        states = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        say(f"  [{phase}] {time.strftime('%H:%M:%S')} exports: {states}; faults {len(injected)} "
            f"(missed {sum(self.missed.values())}); operator: {len(self.ledger.cancels)} cancels, "
            f"{self.ledger.replacements} replacements, {len(self.ledger.reconciliations)} reconciliations")

    @staticmethod
    def _webhooks(system: ChaosSystem) -> dict[str, Any]:
        """What the tenant's receiver saw: requests, the events it took, and what it answered."""
        received = system.receiver.received() if system.receiver is not None else []
        return {"requests": len(received), "events_taken": len({r.event_id for r in received if r.verified}),
                "answered": dict(Counter(str(r.answered) for r in received))}

    def _report(self, system: ChaosSystem, violations: list[Violation], started: float) -> dict[str, Any]:
        options = self.options
        with connect_owner(system.owner_url) as conn:
            by_state = chaos.final_states(conn)
            slots = chaos.read_slots(conn)
        injected = self.injected()
        return {
            "command": command_line(options),
            "seed": options.seed, "minutes": options.minutes, "rate": options.rate,
            "faults_per_minute": options.faults_per_minute, "grace_seconds": options.grace_seconds,
            "started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
            "duration_seconds": round(time.time() - started, 1),
            "settings": dict(CHAOS_SETTINGS),
            "exports": {"total": sum(by_state.values()), "by_final_state": by_state},
            "faults": {"total": len(injected), "by_kind": dict(Counter(i.kind for i in injected)),
                       "seconds_by_kind": {kind: round(sum(i.ended - i.started for i in injected if i.kind == kind), 1)
                                           for kind in options.kinds},
                       "missed_by_kind": dict(self.missed), "injector_errors_by_kind": dict(self.fault_errors)},
            "operator": {"created": len(self.ledger.created), "cancels": len(self.ledger.cancels),
                         "double_clicks": len(self.ledger.double_clicks), "edits": self.ledger.edits,
                         "replacements": self.ledger.replacements,
                         "reconciliations": len(self.ledger.reconciliations),
                         "unanswered": dict(self.unanswered), "errors": dict(self.workload_errors)},
            "schedule_slots": dict(Counter(r["outcome"] for r in slots.runs)),
            "webhooks": self._webhooks(system),
            "violations": [v.as_json() for v in violations],
            "ok": not violations,
        }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def command_line(options: SoakOptions) -> str:
    kinds = "" if set(options.kinds) == set(KINDS) else f" --faults {','.join(options.kinds)}"
    return (f"exports chaos --minutes {options.minutes:g} --rate {options.rate:g} --seed {options.seed} "
            f"--faults-per-minute {options.faults_per_minute:g} --settle-minutes {options.settle_minutes:g} "
            f"--grace {options.grace_seconds:g}{kinds}"
            + (f" --at-least {options.at_least} --max-minutes {options.max_minutes:g}" if options.at_least else ""))


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(settings: Settings, options: SoakOptions) -> tuple[dict[str, Any], Path]:
    """Runs one soak; returns its report and where it was written. SIGTERM ends it like Ctrl-C: the
    system it started is stopped, not left running."""
    signal.signal(signal.SIGTERM, _interrupt)
    report = Soak(options, settings).run()
    path = options.report_path or (settings.state_dir / "chaos" /
                                   f"report-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
    return report, path


def summary(report: dict[str, Any]) -> Sequence[str]:
    """The report for people: what ran, what was injected, how the exports ended, what broke."""
    lines = [f"{report['exports']['total']} exports in {report['duration_seconds']:.0f}s: "
             + ", ".join(f"{k} {v}" for k, v in sorted(report["exports"]["by_final_state"].items())),
             f"{report['faults']['total']} faults: "
             + ", ".join(f"{k} {v}" for k, v in sorted(report["faults"]["by_kind"].items()))]
    if report.get("schedule_slots"):
        lines.append("schedule slots: " + ", ".join(f"{k} {v}" for k, v in sorted(report["schedule_slots"].items())))
    if report["violations"]:
        lines.append(f"{len(report['violations'])} VIOLATIONS:")
        lines += [f"  {v['rule']} {v['job_id']}: {v['detail']}" for v in report["violations"]]
    else:
        lines.append("no violation")
    return lines

"""What a chaos soak records as it runs, shared by its parts: the faults it injected (``Injection``), what
the simulated operators were answered (``Ledger``), and what the checker found (``Violation``)."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from uuid import UUID


@dataclass(frozen=True)
class Injection:
    """One fault, injected: its kind, what it hit, when it started and ended (``time.time()``), and the
    components it kept from working meanwhile ("database", "broker", "partner", "relay", "scheduler",
    "worker"), so the liveness watch does not blame the system for a wait the fault imposed."""

    kind: str
    target: str
    started: float
    ended: float
    blocks: frozenset[str] = frozenset()
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "blocks": sorted(self.blocks)}


@dataclass(frozen=True)
class CancelAnswer:
    """One cancel click and what it was answered; ``outcome`` is a ``CancellationOutcome`` value, or the
    reply ("Busy", "NotFound"...) when nothing was recorded."""

    job_id: UUID
    request_id: UUID
    outcome: str
    answered_at: float
    found_status: str | None = None


@dataclass(frozen=True)
class Reconciliation:
    """An OutcomeUnknown job the simulated operator reconciled, and the evidence it cited."""

    job_id: UUID
    attempt_id: UUID
    resolution: str
    evidence: str


@dataclass
class Ledger:
    """Everything the workload did and was answered, appended from several threads."""

    created: list[UUID] = field(default_factory=list)
    cancels: list[CancelAnswer] = field(default_factory=list)
    #: Pairs of answers to the same request id sent twice (a double click).
    double_clicks: list[tuple[CancelAnswer, CancelAnswer]] = field(default_factory=list)
    reconciliations: list[Reconciliation] = field(default_factory=list)
    edits: int = 0
    replacements: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, item: Any) -> None:
        with self.lock:
            getattr(self, name).append(item)

    def count(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


@dataclass(frozen=True)
class Violation:
    """A promise the system broke: which (``rule``, a short stable name), for which job, why, and the
    job's full history (its row, events, outbox rows, cancellation requests and partner files)."""

    rule: str
    job_id: UUID | None
    detail: str
    history: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)

    def as_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "job_id": str(self.job_id) if self.job_id else None, "detail": self.detail,
                "at": self.at, "history": self.history}

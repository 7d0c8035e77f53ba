"""``exports destination check``: what a partner's server allows, probed before any export depends on it,
and the delivery mode (``app.delivery.modes``) that fits it.

On one session opened as a delivery opens it (the pinned keys, the credential), in the remote directory,
under scratch dot-names ending in ``.part`` (what the partner agrees to ignore) that it removes again:
writing a file, whether an exclusive create refuses an existing name, ``stat``/``lstat``, listing the
directory, SETSTAT, ``rename``, whether ``rename`` refuses an existing target (the no-overwrite rename),
``posix-rename@openssh.com``, and the ``check-file-name`` sha256. Each probe answers yes, no (the server
refused: its status reply), or not probed; a broken connection ends the check.

How many sessions the server accepts at once is probed last, by opening more sessions as a delivery
opens them (each its own connection and login), held together, up to the destination's ``max_sessions``:
a server that refuses some (MySecureShell's LimitConnectionByUser, a partner's firewall) would otherwise
show only as deliveries failing under load. It decides no mode; the report says to lower ``--max-sessions``.

Whether the partner's ingestion takes a file the moment it appears cannot be seen under a name the
partner ignores: only when asked (``ingestion_window``), the check publishes one empty visible file,
``exports-check-<hex>.probe``, and watches whether it is taken within the window (removing it if not).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field

from app.delivery.classifier import describe, is_status_reply
from app.delivery.config import DestinationConfig
from app.delivery.modes import DeliveryMode
from app.delivery.session import Session

#: The probes, in the order they run, each with what it means for an operator.
PROBES = {
    "write": "create and write a file in the remote directory",
    "exclusive_create": "an exclusive create refuses an existing name (no-rename's guard)",
    "stat": "stat a file (the baseline and confirming look)",
    "lstat": "lstat a file",
    "list": "list the remote directory",
    "setstat": "set a file's times or mode (SETSTAT)",
    "rename": "rename a file",
    "rename_refuses_overwrite": "rename refuses an existing target (the no-overwrite rename)",
    "posix_rename": "posix-rename@openssh.com (renames over a target)",
    "check_file_sha256": "check-file-name sha256 (a server-side hash)",
    "ingested": "the partner's ingestion takes a published file at once (--probe-ingestion)",
}
#: Seconds between two looks at the ingestion probe's file.
INGESTION_POLL = 0.05
_CONTENT = b"exports destination check\n"


@dataclass
class Capabilities:
    """What each probe found: True, False (refused), or None (not probed: an earlier step failed, or it was
    not asked for)."""

    found: dict[str, bool | None] = field(default_factory=lambda: dict.fromkeys(PROBES))
    #: Why a probe said no, in the server's words (redacted of the credential).
    why: dict[str, str] = field(default_factory=dict)
    #: Sessions the server accepted at once (the check's own included), of ``sessions_tried``; None: not probed.
    sessions: int | None = None
    sessions_tried: int | None = None
    #: Why the session after the last accepted one was not (redacted of the credential).
    sessions_why: str = ""

    @property
    def session_advice(self) -> str:
        """One line on the destination's ``max_sessions`` against what the server accepted; "" when it fits."""
        if self.sessions is None or self.sessions_tried is None or self.sessions >= self.sessions_tried:
            return ""
        return (f"the server accepted {self.sessions} session(s) at once of the {self.sessions_tried} the destination "
                f"allows ({self.sessions_why}): `destination edit --max-sessions {max(self.sessions, 1)}`, or the "
                "deliveries past it fail transiently and are retried")

    def missing(self, mode: DeliveryMode) -> list[str]:
        """What ``mode`` needs that the server does not allow (or that was not probed)."""
        return [name for name in mode.needs if not self.found[name]]

    @property
    def recommended(self) -> DeliveryMode | None:
        """The mode to deliver in: standard where it fits (quick-ingest where the ingestion was seen to take
        a file), else no-stat, else no-rename (never under an ingestion that would take a partial file);
        None when none fits, and no delivery can be made without risking a file it did not write."""
        if not self.missing(DeliveryMode.STANDARD):
            return DeliveryMode.QUICK_INGEST if self.found["ingested"] else DeliveryMode.STANDARD
        if not self.missing(DeliveryMode.NO_STAT):
            return DeliveryMode.NO_STAT
        if not self.missing(DeliveryMode.NO_RENAME) and not self.found["ingested"]:
            return DeliveryMode.NO_RENAME
        return None

    @property
    def deliverable(self) -> bool:
        return self.recommended is not None

    @property
    def verdict(self) -> str:
        """The recommendation in one line, as an operator reads it."""
        mode = self.recommended
        if mode is not None:
            return f"{mode.value}: {mode.reason}"
        if not self.found["write"]:
            return "none: nothing can be written in the remote directory"
        if not self.missing(DeliveryMode.NO_RENAME) and self.found["ingested"]:
            return ("none: without a rename that refuses an existing target, the file would be written in place, "
                    "and the partner's ingestion takes files as they appear (a partial one too)")
        reasons = []
        if self.found["rename"] is False:
            reasons.append("rename is refused")
        elif self.found["rename_refuses_overwrite"] is False:
            reasons.append("rename replaces an existing file")
        if self.found["exclusive_create"] is False:
            reasons.append("an exclusive create opens an existing file")
        if self.found["stat"] is False:
            reasons.append("stat is refused")
        return f"none: {', '.join(reasons) or 'a probe could not run'}; no mode can publish a file here without " \
               "risking one it did not write"


def check(session: Session, config: DestinationConfig, *, ingestion_window: float | None = None) -> Capabilities:
    """Probes ``session``'s server in ``config.remote_dir``, removing every scratch file it made; with
    ``ingestion_window`` (seconds), also whether the partner's ingestion takes a published file."""
    result = Capabilities()
    scratch = f"exports-check-{uuid.uuid4().hex}"
    names = {k: config.remote_path(f".{scratch}.{k}.part") for k in ("a", "b", "c", "d", "e")}
    made: set[str] = set()
    sftp = session.sftp
    try:
        if not _probe(result, "write", lambda: _write(sftp, names["a"], made)):
            return result
        result.found["exclusive_create"] = _refused(lambda: _write(sftp, names["a"], made))
        if not result.found["exclusive_create"]:
            result.why["exclusive_create"] = "an exclusive create opened an existing file"
        _probe(result, "stat", lambda: sftp.stat(names["a"]))
        _probe(result, "lstat", lambda: sftp.lstat(names["a"]))
        _probe(result, "list", lambda: sftp.listdir(config.remote_dir))
        _probe(result, "setstat", lambda: sftp.utime(names["a"], (1_700_000_000, 1_700_000_000)))
        if _probe(result, "rename", lambda: _moved(sftp, names["a"], names["b"], made)):
            _write(sftp, names["c"], made)
            refused = _refused(lambda: sftp.rename(names["c"], names["b"]))
            result.found["rename_refuses_overwrite"] = refused
            if not refused:
                made.discard(names["c"])   # it replaced b: c is gone, b holds its bytes
                result.why["rename_refuses_overwrite"] = "rename replaced an existing file"
            _write(sftp, names["d"], made)
            _probe(result, "posix_rename", lambda: _posix_moved(sftp, names["d"], names["b"], made))
        digest_of = names["b"] if names["b"] in made else names["a"]
        expected = hashlib.sha256(_CONTENT).digest()
        if not _probe(result, "check_file_sha256", lambda: session.remote_sha256(digest_of) == expected):
            # remote_sha256 answers None for a hash not offered or refused, as for a wrong one.
            result.why["check_file_sha256"] = "not offered, refused, or not the file's sha256"
        if ingestion_window is not None:
            _ingestion(result, sftp, config, scratch, names["e"], made, ingestion_window)
    finally:
        for path in made:
            try:
                sftp.remove(path)
            except OSError:
                pass   # gone already, or refused: the scratch name is a dot-name the partner ignores
    return result


def _ingestion(result: Capabilities, sftp, config: DestinationConfig, scratch: str, temp: str, made: set[str],
               window: float) -> None:
    """Publishes ``<scratch>.probe`` as a delivery in the fitting mode would (by rename, or by exclusive
    create) and watches it for ``window`` seconds: taken, or still there."""
    if not result.found["stat"]:
        result.why["ingested"] = "not probed: stat is refused, so nothing can be watched"
        return
    visible = config.remote_path(f"{scratch}.probe")
    if result.found["rename"] and result.found["rename_refuses_overwrite"]:
        _write(sftp, temp, made)
        _moved(sftp, temp, visible, made)
    else:
        _write(sftp, visible, made)
    deadline = time.monotonic() + window
    while True:
        try:
            sftp.stat(visible)
        except FileNotFoundError:
            made.discard(visible)
            result.found["ingested"] = True
            return
        if time.monotonic() >= deadline:
            result.found["ingested"] = False
            result.why["ingested"] = f"the published probe file stayed for {window:g} s"
            return
        time.sleep(INGESTION_POLL)


def _probe(result: Capabilities, name: str, action) -> bool:
    try:
        answer = action()
    except OSError as exc:
        if not is_status_reply(exc) and not isinstance(exc, (FileNotFoundError, PermissionError)):
            raise   # not an answer: the connection broke, and the check with it
        result.found[name] = False
        result.why[name] = describe(exc)
        return False
    result.found[name] = answer is not False
    if answer is False:
        result.why[name] = "the server answered, but not with what was asked"
    return result.found[name] is True


def _write(sftp, path: str, made: set[str]) -> None:
    with sftp.open(path, "wbx") as out:
        made.add(path)
        out.write(_CONTENT)


def _moved(sftp, source: str, target: str, made: set[str]) -> None:
    sftp.rename(source, target)
    made.discard(source)
    made.add(target)


def _posix_moved(sftp, source: str, target: str, made: set[str]) -> None:
    sftp.posix_rename(source, target)
    made.discard(source)
    made.add(target)


def _refused(action) -> bool:
    try:
        action()
    except OSError as exc:
        if not is_status_reply(exc):
            raise
        return True
    return False



def sessions(result: Capabilities, open_session: Callable[[], AbstractContextManager[object]], want: int, *,
             redactions: tuple[str, ...] = ()) -> None:
    """Opens sessions with ``open_session`` (a context manager each) while the check's own stays open, and
    holds them all, until ``want`` are open at once or the server refuses one; records how many it
    accepted. Every session it opened is closed before it returns."""
    result.sessions_tried = want
    accepted = 1   # the check's own session
    with ExitStack() as held:
        while accepted < want:
            try:
                held.enter_context(open_session())
            except Exception as exc:   # noqa: BLE001 - any refusal is the answer: how many it accepted
                result.sessions_why = describe(exc, redact=redactions)
                break
            accepted += 1
    result.sessions = accepted

"""``exports destination check``: what a partner's server allows, probed before any export depends on it.

On one session opened as a delivery opens it (the pinned keys, the credential), in the remote directory,
under scratch dot-names ending in ``.part`` (what the partner agrees to ignore) that it removes again:
writing a file, ``stat``/``lstat``, listing the directory, SETSTAT, ``rename``, whether ``rename`` refuses
an existing target (the no-overwrite rename every delivery relies on), ``posix-rename@openssh.com``, and
the ``check-file-name`` sha256. Each probe answers yes, no (the server refused: its status reply), or
not probed; a broken connection ends the check. The delivery this release can make needs a write, a
rename that refuses an existing target, and ``stat`` (the confirming look).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field

from app.delivery.classifier import describe, is_status_reply
from app.delivery.config import DestinationConfig
from app.delivery.session import Session

#: The probes, in the order they run, each with what it means for an operator.
PROBES = {
    "write": "create and write a file in the remote directory",
    "stat": "stat a file (the delivery's confirming look)",
    "lstat": "lstat a file",
    "list": "list the remote directory",
    "setstat": "set a file's times or mode (SETSTAT)",
    "rename": "rename a file",
    "rename_refuses_overwrite": "rename refuses an existing target (the no-overwrite rename)",
    "posix_rename": "posix-rename@openssh.com (renames over a target)",
    "check_file_sha256": "check-file-name sha256 (a server-side hash)",
}
#: What the delivery this release makes needs.
REQUIRED = ("write", "stat", "rename", "rename_refuses_overwrite")
_CONTENT = b"exports destination check\n"


@dataclass
class Capabilities:
    """What each probe found: True, False (refused), or None (not probed: an earlier step failed)."""

    found: dict[str, bool | None] = field(default_factory=lambda: dict.fromkeys(PROBES))
    #: Why a probe said no, in the server's words (redacted of the credential).
    why: dict[str, str] = field(default_factory=dict)

    @property
    def deliverable(self) -> bool:
        return all(self.found[name] for name in REQUIRED)

    @property
    def recommended(self) -> str:
        if self.deliverable:
            return "standard: upload under a temporary name, rename without overwriting, confirm with stat"
        missing = ", ".join(name for name in REQUIRED if not self.found[name])
        return f"none this release can make (it needs {missing}); delivery modes for such servers are not built"


def check(session: Session, config: DestinationConfig) -> Capabilities:
    """Probes ``session``'s server in ``config.remote_dir``, removing every scratch file it made."""
    result = Capabilities()
    scratch = f".exports-check-{uuid.uuid4().hex}"
    names = {k: config.remote_path(f"{scratch}.{k}.part") for k in ("a", "b", "c", "d")}
    made: set[str] = set()
    sftp = session.sftp
    try:
        if not _probe(result, "write", lambda: _write(sftp, names["a"], made)):
            return result
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
    finally:
        for path in made:
            try:
                sftp.remove(path)
            except OSError:
                pass   # gone already, or refused: the scratch name is a dot-name the partner ignores
    return result


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


"""Writing a completion marker: after the file, ``<file>.done`` or ``<file>.manifest.json`` with the content
cutoff 2 recorded, the way the file itself is published (an exclusive create under a temporary name, then
the rename that refuses an existing target), so a marker is whole whenever it is there, and never
written over one already there. In mode no-rename, whose server cannot rename, it is created in place
by an exclusive create instead (``app.delivery.in_place``), which never writes over one either.

The delivery writes it right after confirming the file; recovery and reconciliation write it for an
attempt whose file they prove but whose marker is missing (a worker lost between the two renames), on
the same terms: only with the file there as recorded.
"""

from __future__ import annotations

from app.delivery import listing
from app.delivery.config import DestinationConfig
from app.delivery.evidence import Listing
from app.delivery.session import Session
from app.store.types import ExpectedFile


def write_marker(session: Session, config: DestinationConfig, expected: ExpectedFile, attempt_id: str) -> None:
    """Writes the marker; raises the server's refusal (a name already taken) or the connection's error,
    after removing the temporary file where it may remain."""
    assert expected.marker_name is not None and expected.marker is not None
    if not config.delivery_mode.renames:
        with session.sftp.open(config.remote_path(expected.marker_name), "wbx") as out:
            out.write(expected.marker)
        return
    temp = config.remote_path(listing.temp_name(expected.marker_name, attempt_id))
    try:
        with session.sftp.open(temp, "wbx") as out:
            out.write(expected.marker)
        session.sftp.rename(temp, config.remote_path(expected.marker_name))
    except BaseException:
        try:
            session.sftp.remove(temp)
        except Exception:   # gone already, or the connection is: the scavenging agreement covers it
            pass
        raise


def complete(session: Session, config: DestinationConfig, expected: ExpectedFile, attempt_id: str) -> Listing:
    """What the destination shows for the file and its marker, once the marker is written where the file
    is there as recorded and the marker is not; nothing is written otherwise."""
    assert expected.marker_name is not None
    before = listing.list_final(session, config, expected.name, with_hash=True, marker_name=expected.marker_name)
    if not before.present or before.contradicts(expected) or before.marker is not None:
        return before
    try:
        write_marker(session, config, expected, attempt_id)
    except OSError:
        pass   # refused (another writer won) or not confirmed: the look below says what is there
    return listing.list_final(session, config, expected.name, with_hash=True, marker_name=expected.marker_name)

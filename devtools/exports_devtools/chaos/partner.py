"""The partner's directory as the chaos checker sees it: the final files in each destination's
directory, hashed once each, and the pattern of a final file's name."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.delivery.listing import ACK_SUFFIX


@dataclass(frozen=True)
class PartnerFile:
    relative: str          # to the partner's root: "inbox/<final name>"
    size: int
    sha256: str

    def as_json(self) -> dict[str, Any]:
        return {"path": self.relative, "size": self.size, "sha256": self.sha256}


class Partner:
    """The partner's final files in each destination's directory, hashed once each."""

    def __init__(self, root: Path, directories: Iterable[str | None], *, ingested: Iterable[str] = ()):
        self.root = root
        self.directories = sorted({d.strip("/") for d in directories if d is not None})
        #: Where the partner's ingestion moves what it takes: its files are still the partner's.
        self.ingested_dirs = sorted({d.strip("/") for d in ingested})
        self._files: dict[str, PartnerFile | None] = {}

    @staticmethod
    def relative(directory: str | None, name: str) -> str:
        directory = (directory or "").strip("/")
        return f"{directory}/{name}" if directory else name

    def file(self, directory: str | None, name: str) -> PartnerFile | None:
        relative = self.relative(directory, name)
        if relative not in self._files:
            self._files[relative] = _read_file(self.root / relative, relative)
        return self._files[relative]

    def files(self, name: str) -> list[PartnerFile]:
        """The files under this final name, in every directory, and taken by the partner's ingestion."""
        return [f for d in (*self.directories, *self.ingested_dirs) if (f := self.file(d, name)) is not None]

    def ingested(self, name: str) -> PartnerFile | None:
        """The file under this name the partner's ingestion took, if any."""
        return next((f for d in self.ingested_dirs if (f := self.file(d, name)) is not None), None)

    def final_names(self) -> list[str]:
        """The relative paths of the final files there now; dot-files (uploads under their temporary
        names) and acknowledgments are not."""
        found = []
        for directory in (*self.directories, *self.ingested_dirs):
            path = self.root / directory
            if path.is_dir():
                found += [self.relative(directory, p.name) for p in path.iterdir()
                          if not p.name.startswith(".") and not p.name.endswith(ACK_SUFFIX) and p.is_file()]
        return sorted(found)


def _read_file(path: Path, relative: str) -> PartnerFile | None:
    digest = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    return PartnerFile(relative, size, digest.hexdigest())

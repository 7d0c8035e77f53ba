"""docs/architecture.md is the newcomer's map: it names every file of the product, and every path it names
exists, so a file added, moved or deleted without the map fails here rather than misleading a reader."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
#: The shipped migrations are named as their folder: each is one step from an older schema.
NAMED_AS_A_FOLDER = "app/store/migrations/"


def _named() -> set[str]:
    return set(re.findall(r"`(app/[\w/]+(?:\.\w+|/))`", DOC.read_text(encoding="utf-8")))


def test_the_architecture_page_names_every_file_of_the_product():
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "app").rglob("*") if p.suffix in (".py", ".sql")}
    unnamed = sorted(f for f in files if f not in _named() and not f.startswith(NAMED_AS_A_FOLDER))

    assert unnamed == []


def test_every_path_the_architecture_page_names_exists():
    assert sorted(path for path in _named() if not (ROOT / path).exists()) == []

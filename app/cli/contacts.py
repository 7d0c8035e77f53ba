"""Contacts for a tenant: imported from a CSV file (validated whole before a single row is loaded) or
generated (realistic, reproducible, fast: one COPY)."""

from __future__ import annotations

import csv
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from app.cli.common import MAX_NAME, bad_input, printable
from app.delivery.profile import attribute_name_problem
from app.store.directory import NewContact

#: Columns a CSV file must have; company, phone and consent are optional.
REQUIRED_COLUMNS = ("email", "full_name")
OPTIONAL_COLUMNS = ("company", "phone", "consent")
#: Longest field accepted from a file.
MAX_FIELD = 320
#: The most custom fields (extra columns) a file may carry; their names are ``attribute_name_problem``'s.
MAX_ATTRIBUTES = 100
#: Largest file accepted, in bytes: larger imports go through COPY by a DBA, not this script.
MAX_FILE_BYTES = 200 * 1024 * 1024
#: The control characters a name, company or phone may hold: CRM data has multi-line and tabbed values,
#: which a CSV file quotes and the export's CSV quotes again. NUL and the rest are refused, and an email
#: address holds none.
_MULTI_LINE = "\t\n\r"
_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0", ""}

_FIRST = ("Ada", "Alan", "Grace", "Linus", "Margaret", "Dennis", "Barbara", "Ken", "Frances", "Edsger", "Radia",
          "Tim", "Katherine", "John", "Hedy", "Donald", "Sophie", "Guido", "Anita", "Niklaus", "Joan", "Bjarne",
          "Mary", "Rasmus", "Shafi", "Leslie", "Whitfield", "Adele", "Jean", "Yukihiro", "Amara", "Kofi",
          "Ingrid", "Mateo", "Priya", "Chen", "Olga", "Tomás", "Zanele", "Henrik")
_LAST = ("Lovelace", "Turing", "Hopper", "Torvalds", "Hamilton", "Ritchie", "Liskov", "Thompson", "Allen",
         "Dijkstra", "Perlman", "Berners-Lee", "Johnson", "McCarthy", "Lamarr", "Knuth", "Wilson", "van Rossum",
         "Borg", "Wirth", "Clarke", "Stroustrup", "Shaw", "Lerdorf", "Goldwasser", "Lamport", "Diffie",
         "Goldberg", "Sammet", "Matsumoto", "Okafor", "Mensah", "Larsen", "García", "Raman", "Wei", "Petrova",
         "Ferreira", "Dlamini", "Nilsson")
_COMPANY = ("Northwind", "Contoso", "Initech", "Globex", "Umbrella Analytics", "Hooli", "Vandelay Industries",
            "Stark Logistics", "Wayne Foods", "Acme Freight", "Soylent Labs", "Tyrell Systems", "Cyberdyne",
            "Wonka Retail", "Pied Piper", "Massive Dynamic", None)
_DOMAIN = ("example.com", "example.org", "example.net", "mail.example", "post.example")


def parse_consent(raw: str, line: int) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_input(f"line {line}: consent must be true or false, not {printable(raw, 40)!r}")


def _has_controls(value: str, allowed: str = "") -> bool:
    return any((ord(c) < 32 or ord(c) == 127) and c not in allowed for c in value)


def _field(row: dict[str, str | None], column: str, line: int, *, required: bool) -> str | None:
    value = row.get(column)
    value = value.strip() if isinstance(value, str) else None
    if not value:
        if required:
            raise bad_input(f"line {line}: {column} is empty")
        return None
    if _has_controls(value, allowed="" if column == "email" else _MULTI_LINE):
        what = "whitespace or control characters" if column == "email" else \
            "control characters (only tab, CR and LF are allowed)"
        raise bad_input(f"line {line}: {column} contains {what}")
    if len(value) > (MAX_NAME if column == "full_name" else MAX_FIELD):
        raise bad_input(f"line {line}: {column} is too long ({len(value)} characters)")
    return value


def _attribute_names(header: list[str], path: Path) -> list[str]:
    """The header's extra columns, the tenant's custom fields: each named, once, in printable text."""
    extra = [name for name in header if name not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
    where = printable(str(path), 120)
    repeated = next((name for name, n in Counter(header).items() if n > 1), None)
    if repeated is not None:
        raise bad_input(f"{where}: column {printable(repeated, 60)!r} appears more than once in the header")
    for name in extra:
        if not name.strip():
            raise bad_input(f"{where}: a column of the header has no name")
        problem = attribute_name_problem(name)
        if problem is not None:
            # A delivery profile names a custom field by this name (attributes.<name>): it must be one.
            raise bad_input(f"{where}: column name {printable(name, 60)!r} {problem}")
    if len(extra) > MAX_ATTRIBUTES:
        raise bad_input(f"{where}: {len(extra)} custom columns; at most {MAX_ATTRIBUTES}")
    return extra


def read_csv(path: Path) -> list[NewContact]:
    """Every row, validated; raises CliError (bad input) naming the first bad line, before anything is loaded.
    Columns beyond the known ones are the tenant's custom fields: each row's non-empty values are kept in
    its ``attributes`` under the column's name."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise bad_input(f"cannot read {printable(str(path), 120)}: {exc.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise bad_input(f"{printable(str(path), 120)} is larger than {MAX_FILE_BYTES // (1024 * 1024)} MB")
    contacts: list[NewContact] = []
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise bad_input(f"{printable(str(path), 120)}: missing column(s) {', '.join(missing)}; "
                                f"the header needs {', '.join(REQUIRED_COLUMNS)} "
                                f"(optional: {', '.join(OPTIONAL_COLUMNS)}, and any column of the tenant's own)")
            custom = _attribute_names(list(header), path)
            for row in reader:
                line = reader.line_num
                if None in row:
                    raise bad_input(f"line {line}: more fields than columns")
                email = _field(row, "email", line, required=True)
                if email is None or "@" not in email:
                    raise bad_input(f"line {line}: email {printable(email or '', 60)!r} has no @")
                contacts.append(NewContact(
                    email=email,
                    full_name=_field(row, "full_name", line, required=True) or "",
                    company=_field(row, "company", line, required=False),
                    phone=_field(row, "phone", line, required=False),
                    consent=parse_consent(row.get("consent") or "", line),
                    attributes={name: value for name in custom
                                if (value := _field(row, name, line, required=False)) is not None},
                ))
    except UnicodeDecodeError:
        raise bad_input(f"{printable(str(path), 120)} is not UTF-8") from None
    except csv.Error as exc:
        raise bad_input(f"{printable(str(path), 120)}: {exc}") from None
    except OSError as exc:
        raise bad_input(f"cannot read {printable(str(path), 120)}: {exc.strerror}") from None
    return contacts


def generate(count: int, *, seed: int | None = None) -> Iterator[NewContact]:
    """Plausible contacts; about one in eight has not consented, so the export policy has work to do."""
    rng = random.Random(seed)
    for n in range(count):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        company = rng.choice(_COMPANY)
        local = f"{first}.{last}".lower().replace(" ", "").replace("á", "a").replace("í", "i").replace("é", "e")
        yield NewContact(
            email=f"{local}.{n}@{rng.choice(_DOMAIN)}",
            full_name=f"{first} {last}",
            company=company,
            phone=(f"+1-555-{rng.randrange(100, 1000):03d}-{rng.randrange(0, 10000):04d}"
                   if rng.random() < 0.7 else None),
            consent=rng.random() >= 0.125,
        )

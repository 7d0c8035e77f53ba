"""A destination's delivery profile: what the partner receives (columns, format, compression, file name).

A profile is a value: it is checked when it is made (``Profile.checked``), stored whole as one version of
the destination's profile (``delivery_profiles``, append-only), and read back with the job, so a build
uses exactly one version from its first byte to its last, and cutoff 2 records which. Every refusal is a
``ProfileError`` with one line that says what to change; nothing here reads the database or the disk.

The file name is a template rendered once, when the export is created, and stored with its delivery key:
a replacement delivers under its original's name, and cutoff 2 records it as it always did.
"""

from __future__ import annotations

import enum
import json
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.delivery.errors import ProfileError
from app.delivery.openpgp import PartnerKey, parse_signing_ref

#: The contact fields a column may name; a custom field is ``attributes.<name>``.
CONTACT_FIELDS = ("email", "full_name", "company", "phone")
ATTRIBUTE_PREFIX = "attributes."

#: A custom field's name: letters and digits of any script, and a few separators, never a quote, a
#: semicolon or a control character. ``contacts import`` refuses any other header, so every field a
#: tenant has can be named in a profile, and a name never needs escaping anywhere it travels.
MAX_ATTRIBUTE_NAME = 64
_ATTRIBUTE_NAME = re.compile(r"[^\W_][\w .()/#&+-]*", re.UNICODE)

MAX_COLUMNS = 200
MAX_HEADER = 128

#: The partner server's limit on a name is 255 bytes on every server we know; a temporary name adds a
#: dot, the attempt id and ``.part`` (43 bytes) to the name it becomes, and the longest completion
#: marker's name adds ``.manifest.json`` (14) to the file's.
MAX_FILE_NAME_BYTES = 255 - 43 - 14
DEFAULT_FILE_NAME = "contacts-{delivery_key}.csv"

#: Characters a file name template may hold outside its placeholders: what every SFTP server, and the
#: partner's Windows or Unix ingestion, takes in a name without quoting.
_NAME_TEXT = re.compile(r"[\w .,+=@()\[\]~-]*", re.UNICODE)
#: strftime directives a ``{created:...}`` placeholder may use: digits only, so a date never adds a separator.
_DATE_SPEC = re.compile(r"(?:%[YmdHMSjy]|[-_.T])+")
#: A width pads with zeros, never spaces: ``{sequence:06d}``.
_SEQUENCE_SPEC = re.compile(r"(?:0[1-9])?d?")
PLACEHOLDERS = ("delivery_key", "tenant", "created", "sequence")
#: The longest each placeholder renders (a delivery key is 32 hex digits; a sequence fits a bigint).
_SAMPLE_KEY = "f" * 32
_SAMPLE_SEQUENCE = 9_223_372_036_854_775_807


class Format(enum.StrEnum):
    CSV = "csv"
    JSONL = "jsonl"


class Quoting(enum.StrEnum):
    #: Only a field that needs it (holds the delimiter, a quote or a line break) is quoted.
    MINIMAL = "minimal"
    #: Every non-empty field is quoted.
    ALL = "all"


class LineEnding(enum.StrEnum):
    LF = "lf"
    CRLF = "crlf"


class Compression(enum.StrEnum):
    NONE = "none"
    GZIP = "gzip"


class Marker(enum.StrEnum):
    """What is written after the file, for a partner that ingests only complete transfers."""

    NONE = "none"
    #: An empty ``<file>.done``.
    DONE = "done"
    #: ``<file>.manifest.json``: the file's name, bytes, sha256, rows, the export's id and delivery key.
    MANIFEST = "manifest"

    def name_for(self, file_name: str) -> str | None:
        return {Marker.NONE: None, Marker.DONE: file_name + ".done",
                Marker.MANIFEST: file_name + ".manifest.json"}[self]


def attribute_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a custom field's name, or None when it can."""
    if not name:
        return "is empty"
    if len(name) > MAX_ATTRIBUTE_NAME:
        return f"is longer than {MAX_ATTRIBUTE_NAME} characters"
    if name != name.strip() or not _ATTRIBUTE_NAME.fullmatch(name):
        return ("must start with a letter or digit and hold only letters, digits, spaces and . ( ) / # & + - _ "
                "(no quotes, semicolons or control characters)")
    return None


@dataclass(frozen=True)
class Column:
    """One column of the partner's file: a contact field (or ``attributes.<name>``) under the partner's header."""

    source: str
    header: str

    @property
    def attribute(self) -> str | None:
        """The custom field's name when the column is one."""
        return self.source[len(ATTRIBUTE_PREFIX):] if self.source.startswith(ATTRIBUTE_PREFIX) else None

    @classmethod
    def parse(cls, text: str) -> Column:
        """``SOURCE`` or ``SOURCE=HEADER`` (the header defaults to the source's name)."""
        source, sep, header = text.partition("=")
        source = source.strip()
        column = cls(source, header if sep else (source[len(ATTRIBUTE_PREFIX):]
                                                 if source.startswith(ATTRIBUTE_PREFIX) else source))
        column.check()
        return column

    def check(self) -> None:
        if self.attribute is not None:
            problem = attribute_name_problem(self.attribute)
            if problem is not None:
                raise ProfileError(f"column {_shown(self.source)}: the custom field's name {problem}")
        elif self.source not in CONTACT_FIELDS:
            raise ProfileError(f"unknown column {_shown(self.source)}: one of {', '.join(CONTACT_FIELDS)}, "
                               f"or {ATTRIBUTE_PREFIX}<name> for a custom field")
        if not self.header or len(self.header) > MAX_HEADER or _has_controls(self.header):
            raise ProfileError(f"column {_shown(self.source)}: its header must be 1 to {MAX_HEADER} characters "
                               "without control characters")


DEFAULT_COLUMNS = tuple(Column(name, name) for name in CONTACT_FIELDS)


@dataclass(frozen=True)
class Profile:
    """What a destination's partner receives. The defaults are the file every export was before profiles:
    the four contact fields, CSV with a header, LF, no BOM, uncompressed, ``contacts-<key>.csv``."""

    columns: tuple[Column, ...] = DEFAULT_COLUMNS
    format: Format = Format.CSV
    delimiter: str = ","
    quoting: Quoting = Quoting.MINIMAL
    header: bool = True
    line_ending: LineEnding = LineEnding.LF
    bom: bool = False
    #: OWASP's CSV-injection defence: a cell beginning with = + - @ tab or CR gets a leading quote, so a
    #: spreadsheet shows it as text instead of evaluating it. Off by default: it changes the data.
    neutralize_formulas: bool = False
    compression: Compression = Compression.NONE
    file_name: str = DEFAULT_FILE_NAME
    #: The time zone ``{created}`` is rendered in.
    time_zone: str = "UTC"
    #: OpenPGP: the partner keys the file is encrypted to (after compression); none: not encrypted.
    encrypt_to: tuple[PartnerKey, ...] = ()
    #: A reference to our signing key (``keyfile:/path`` or ``env-keyfile:NAME``), never the key.
    sign_with: str | None = None
    marker: Marker = Marker.NONE
    #: Anything a later release adds, kept as read so a profile round-trips through this one.
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def checked(cls, **settings: Any) -> Profile:
        profile = cls(**settings)
        profile.check()
        return profile

    def changed(self, **settings: Any) -> Profile:
        """This profile with ``settings`` changed, checked whole."""
        profile = replace(self, **settings)
        profile.check()
        return profile

    def check(self) -> None:
        if not 1 <= len(self.columns) <= MAX_COLUMNS:
            raise ProfileError(f"a profile has 1 to {MAX_COLUMNS} columns")
        for column in self.columns:
            column.check()
        repeated = next((h for h, n in Counter(c.header for c in self.columns).items() if n > 1), None)
        if repeated is not None:
            raise ProfileError(f"header {_shown(repeated)} names two columns")
        if len(self.delimiter) != 1 or not self.delimiter.isascii() or self.delimiter in '"\r\n\x00 ' \
                or (not self.delimiter.isprintable() and self.delimiter != "\t") or self.delimiter.isalnum():
            raise ProfileError("the delimiter is one ASCII punctuation character or tab, not a quote")
        if self.format is Format.JSONL and self.neutralize_formulas:
            raise ProfileError("formula neutralising is for CSV opened in a spreadsheet; JSON Lines has no cells")
        if self.format is Format.JSONL and self.bom:
            raise ProfileError("a byte order mark is for CSV; JSON parsers refuse one before JSON Lines")
        try:
            ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ProfileError(f"unknown time zone {_shown(self.time_zone)} (an IANA name such as Europe/Berlin)") \
                from None
        check_file_name(self.file_name, self.time_zone)
        fingerprints = [key.fingerprint for key in self.encrypt_to]
        if len(set(fingerprints)) != len(fingerprints):
            raise ProfileError("the same partner key is given twice")
        if self.sign_with is not None:
            if not self.encrypt_to:
                raise ProfileError("signing is for an encrypted file: give the partner's key to encrypt to")
            parse_signing_ref(self.sign_with)   # KeyRefused (a ProfileError's sibling) names no value

    @property
    def uses_sequence(self) -> bool:
        return "sequence" in _placeholders(self.file_name)

    def render_file_name(self, *, delivery_key: str, tenant_name: str, created_at: datetime,
                         sequence: int | None = None) -> str:
        return _render(self.file_name, delivery_key=delivery_key, tenant=tenant_slug(tenant_name),
                       created=created_at.astimezone(ZoneInfo(self.time_zone)), sequence=sequence)

    def to_json(self) -> dict[str, Any]:
        return {**self.extra,
                "columns": [{"source": c.source, "header": c.header} for c in self.columns],
                "format": self.format.value, "delimiter": self.delimiter, "quoting": self.quoting.value,
                "header": self.header, "line_ending": self.line_ending.value, "bom": self.bom,
                "neutralize_formulas": self.neutralize_formulas, "compression": self.compression.value,
                "file_name": self.file_name, "time_zone": self.time_zone,
                "encrypt_to": [key.to_json() for key in self.encrypt_to], "sign_with": self.sign_with,
                "marker": self.marker.value}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Profile:
        """A stored profile. It was checked when it was stored; this only reads it."""
        known = {"columns", "format", "delimiter", "quoting", "header", "line_ending", "bom", "neutralize_formulas",
                 "compression", "file_name", "time_zone", "encrypt_to", "sign_with", "marker"}
        default = cls()
        return cls(
            columns=tuple(Column(c["source"], c["header"]) for c in data["columns"]) if "columns" in data
            else default.columns,
            format=Format(data.get("format", default.format)),
            delimiter=data.get("delimiter", default.delimiter),
            quoting=Quoting(data.get("quoting", default.quoting)),
            header=bool(data.get("header", default.header)),
            line_ending=LineEnding(data.get("line_ending", default.line_ending)),
            bom=bool(data.get("bom", default.bom)),
            neutralize_formulas=bool(data.get("neutralize_formulas", default.neutralize_formulas)),
            compression=Compression(data.get("compression", default.compression)),
            file_name=data.get("file_name", default.file_name),
            time_zone=data.get("time_zone", default.time_zone),
            encrypt_to=tuple(PartnerKey.from_json(key) for key in data.get("encrypt_to") or ()),
            sign_with=data.get("sign_with"),
            marker=Marker(data.get("marker", default.marker)),
            extra={k: v for k, v in data.items() if k not in known})

    def describe(self) -> list[str]:
        """The profile in lines an operator reads."""
        if self.format is Format.CSV:
            shape = (f"CSV, delimiter {self.delimiter!r}, quoting {self.quoting.value}, "
                     f"{'header' if self.header else 'no header'}, {self.line_ending.value.upper()}"
                     f"{', BOM' if self.bom else ''}{', formulas neutralised' if self.neutralize_formulas else ''}")
        else:
            shape = f"JSON Lines (one object per contact), {self.line_ending.value.upper()}"
        columns = ", ".join(c.source if c.header == c.source else f"{c.source}={c.header}" for c in self.columns)
        return [f"columns: {columns}",
                f"format: {shape}",
                f"compression: {self.compression.value}",
                f"encryption: {self._encryption()}",
                f"file name: {self.file_name} (dates in {self.time_zone})",
                f"completion marker: {self.marker.name_for('<file>') or 'none'}"]

    def marker_file(self, file_name: str, *, size: int, sha256: bytes, rows: int, export_id: UUID,
                    delivery_key: str) -> tuple[str, bytes] | None:
        """The completion marker for a built file: its name and its whole content, or None without one.
        A function of what cutoff 2 records with it, so it can be recorded and checked byte for byte."""
        name = self.marker.name_for(file_name)
        if name is None:
            return None
        if self.marker is Marker.DONE:
            return name, b""
        manifest = {"name": file_name, "bytes": size, "sha256": sha256.hex(), "rows": rows,
                    "export_id": str(export_id), "delivery_key": delivery_key}
        return name, (json.dumps(manifest, sort_keys=True, separators=(",", ":")) + "\n").encode()

    def _encryption(self) -> str:
        if not self.encrypt_to:
            return "none"
        keys = ", ".join(f"{k.fingerprint} ({k.user_ids[0] if k.user_ids else 'no user id'}"
                         f"{', expires ' + k.expires_at.strftime('%Y-%m-%d') if k.expires_at else ''})"
                         for k in self.encrypt_to)
        signed = f", signed with {parse_signing_ref(self.sign_with).shown}" if self.sign_with else ", not signed"
        return f"OpenPGP to {keys}{signed}"


DEFAULT_PROFILE = Profile()


def tenant_slug(name: str) -> str:
    """The tenant's name as a file name may carry it: ASCII lower case, digits and hyphens, at most 40."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii").lower()
    return re.sub(r"[^a-z0-9]+", "-", ascii_name).strip("-")[:40].strip("-") or "tenant"


def check_file_name(template: str, time_zone: str = "UTC") -> None:
    """Refuses a template that could render a path, a hidden or relative name, or one over the limit."""
    fields = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ProfileError(f"file name template: {exc} (a placeholder is {{name}} or {{name:format}})") from None
    for text, name, spec, conversion in parsed:
        if not _NAME_TEXT.fullmatch(text):
            raise ProfileError("file name template: only letters, digits, spaces and . , + = @ ( ) [ ] ~ - _ "
                               "outside placeholders (no path separators)")
        if name is None:
            continue
        if name not in PLACEHOLDERS or conversion:
            raise ProfileError(f"file name template: unknown placeholder {{{_shown(name, 40)}}}; "
                               f"one of {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        if spec and not ((name == "created" and _DATE_SPEC.fullmatch(spec))
                         or (name == "sequence" and _SEQUENCE_SPEC.fullmatch(spec))):
            raise ProfileError(f"file name template: {{{name}:{_shown(spec, 40)}}} is not allowed "
                               "({created:%Y%m%d} takes %Y %m %d %H %M %S %j %y and - _ . T; {sequence:06d} a width)")
        fields.append(name)
    if "delivery_key" not in fields and "sequence" not in fields:
        raise ProfileError("file name template: it needs {delivery_key} or {sequence}, so two exports never "
                           "share a name")
    sample = _render(template, delivery_key=_SAMPLE_KEY, tenant="t" * 40,
                     created=datetime(2000, 12, 31, 23, 59, 59, tzinfo=ZoneInfo(time_zone)), sequence=_SAMPLE_SEQUENCE)
    if sample.startswith(".") or ".." in sample or sample != sample.strip():
        raise ProfileError("file name template: a name may not start with a dot, hold '..', "
                           "or start or end with a space")
    if len(sample.encode("utf-8")) > MAX_FILE_NAME_BYTES:
        raise ProfileError(f"file name template: a name can reach {len(sample.encode('utf-8'))} bytes; "
                           f"at most {MAX_FILE_NAME_BYTES}")


def _placeholders(template: str) -> set[str]:
    return {name for _text, name, _spec, _conv in string.Formatter().parse(template) if name}


def _render(template: str, *, delivery_key: str, tenant: str, created: datetime, sequence: int | None) -> str:
    values: dict[str, Any] = {"delivery_key": delivery_key, "tenant": tenant, "created": _Date(created),
                              "sequence": sequence if sequence is not None else 0}
    return template.format_map(values)


class _Date:
    """``{created}`` alone is the date as YYYYMMDD; with a spec, strftime of it."""

    def __init__(self, value: datetime) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        return self.value.strftime(spec or "%Y%m%d")


def _has_controls(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in text)


def _shown(text: str, limit: int = 60) -> str:
    """A value in a refusal: escaped and cut, so a hostile string prints as one harmless line."""
    cleaned = text.encode("unicode_escape").decode("ascii")
    return repr(cleaned if len(cleaned) <= limit else cleaned[:limit] + "...")


def columns_from(texts: Sequence[str]) -> tuple[Column, ...]:
    return tuple(Column.parse(text) for text in texts)

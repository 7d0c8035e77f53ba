"""The delivery profile's options of ``destination add`` and ``destination edit``, and how they make a
``Profile``: each option parsed where argparse sees it, the keys read and checked when they are given,
the whole profile checked once, and every refusal one line with exit 2."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from app.cli.common import bad_input, printable, text
from app.delivery.errors import ProfileError
from app.delivery.openpgp import OpenPGPError, PartnerKey, check_signing_key, parse_public_key, parse_signing_ref
from app.delivery.profile import Column, Compression, Format, LineEnding, Marker, Profile, Quoting

_ON_OFF = {"on": True, "off": False}


def add(p: argparse.ArgumentParser, *, editing: bool) -> None:
    """The profile's options, on ``destination add`` (with their defaults) or ``edit`` (unchanged unless given)."""
    keep = " (default: unchanged)" if editing else ""
    options = p.add_argument_group("delivery profile: what the partner receives")
    options.add_argument("--column", dest="columns", action="append", type=_column, metavar="SOURCE[=HEADER]",
                         help="a column, in order, repeated for each: email, full_name, company, phone or "
                              "attributes.<custom field>, under the header the partner wants (default: the "
                              "source's name); the columns given replace the list" + (keep or
                              " (default: email, full_name, company, phone)"))
    options.add_argument("--format", type=_choice(Format), metavar="csv|jsonl",
                         help="CSV or JSON Lines" + (keep or " (default csv)"))
    options.add_argument("--delimiter", type=_delimiter, metavar="CHAR",
                         help="CSV's delimiter: one character, or 'tab'" + (keep or " (default ',')"))
    options.add_argument("--quoting", type=_choice(Quoting), metavar="minimal|all",
                         help="CSV: quote only fields that need it (minimal) or every field (all)"
                              + (keep or " (default minimal)"))
    options.add_argument("--header", type=_on_off, metavar="on|off",
                         help="CSV: a header line" + (keep or " (default on)"))
    options.add_argument("--line-ending", type=_choice(LineEnding), metavar="lf|crlf",
                         help="how lines end" + (keep or " (default lf)"))
    options.add_argument("--bom", type=_on_off, metavar="on|off",
                         help="a UTF-8 byte order mark first" + (keep or " (default off)"))
    options.add_argument("--neutralize-formulas", type=_on_off, metavar="on|off",
                         help="CSV: a cell beginning with = + - @ tab or CR gets a leading ' so a spreadsheet "
                              "shows it as text (OWASP's CSV injection advice; it changes the data)"
                              + (keep or " (default off)"))
    options.add_argument("--compression", type=_choice(Compression), metavar="none|gzip",
                         help="the file compressed" + (keep or " (default none)"))
    options.add_argument("--file-name", type=text(512), metavar="TEMPLATE",
                         help="the file name template: {delivery_key}, {sequence} (or {sequence:06d}), {tenant}, "
                              "{created} (or {created:%%Y-%%m-%%d}); it needs {delivery_key} or {sequence}"
                              + (keep or " (default contacts-{delivery_key}.csv)"))
    options.add_argument("--marker", type=_choice(Marker), metavar="none|done|manifest",
                         help="for a partner that ingests only complete transfers: after the file, an empty "
                              "<file>.done, or <file>.manifest.json (name, bytes, sha256, rows, export id, delivery "
                              "key); the export is Completed only once both are there" + (keep or " (default none)"))
    encryption = options.add_mutually_exclusive_group()
    encryption.add_argument("--encrypt-to", action="append", type=text(4096), metavar="KEY_FILE",
                            help="OpenPGP: encrypt the file (after compression) to the partner's public key in this "
                                 "ASCII-armored file, repeated for each key; its fingerprint is pinned. A key that is "
                                 "malformed, expired or cannot encrypt is refused" + (keep or " (default: none)"))
    if editing:
        encryption.add_argument("--no-encryption", action="store_true", help="stop encrypting (and signing)")
    signing = options.add_mutually_exclusive_group()
    signing.add_argument("--sign-with", type=text(1024), metavar="REF",
                         help="OpenPGP: also sign with our key, given by reference: keyfile:/path or env-keyfile:VAR "
                              "(an unprotected secret key file; never stored, only the reference is)"
                         + (keep or " (default: not signed)"))
    if editing:
        signing.add_argument("--no-signing", action="store_true", help="stop signing")
    options.add_argument("--time-zone", type=text(64), metavar="ZONE",
                         help="the time zone {created} is rendered in (an IANA name)" + (keep or " (default UTC)"))


def profile(args: argparse.Namespace, base: Profile) -> Profile:
    """``base`` with the options given changed, checked whole; a refusal is one line and exit 2."""
    settings: dict[str, Any] = {}
    for option in ("format", "delimiter", "quoting", "header", "line_ending", "bom", "neutralize_formulas",
                   "compression", "file_name", "time_zone", "marker"):
        value = getattr(args, option)
        if value is not None:
            settings[option] = value
    if args.columns:
        settings["columns"] = tuple(args.columns)
    try:
        if getattr(args, "no_encryption", False):
            settings.update(encrypt_to=(), sign_with=None)
        if args.encrypt_to:
            settings["encrypt_to"] = tuple(_partner_key(path) for path in args.encrypt_to)
        if getattr(args, "no_signing", False):
            settings["sign_with"] = None
        if args.sign_with:
            ref = parse_signing_ref(args.sign_with)
            check_signing_key(ref)   # the key is there, can sign and needs no passphrase: now, not at the export
            settings["sign_with"] = str(ref)
        return base.changed(**settings)
    except (ProfileError, OpenPGPError) as exc:
        raise bad_input(str(exc)) from None


def _partner_key(path: str) -> PartnerKey:
    try:
        text_ = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise bad_input(f"--encrypt-to {printable(path, 120)}: not an ASCII-armored key (not UTF-8 text)") from None
    except OSError as exc:
        raise bad_input(f"--encrypt-to {printable(path, 120)}: {exc.strerror}") from None
    try:
        return parse_public_key(text_)
    except OpenPGPError as exc:
        raise bad_input(f"--encrypt-to {printable(path, 120)}: {exc}") from None


def _column(value: str) -> Column:
    try:
        return Column.parse(value)
    except ProfileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_column.__name__ = "column"


def _delimiter(value: str) -> str:
    return "\t" if value.lower() in ("tab", "\\t") else value


def _on_off(value: str) -> bool:
    if value.lower() not in _ON_OFF:
        raise argparse.ArgumentTypeError("on or off")
    return _ON_OFF[value.lower()]


_on_off.__name__ = "on/off"


def _choice(kind):
    def parse(value: str):
        try:
            return kind(value.lower())
        except ValueError:
            raise argparse.ArgumentTypeError(f"one of {', '.join(k.value for k in kind)}") from None

    parse.__name__ = kind.__name__.lower()
    return parse

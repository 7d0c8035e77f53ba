"""The delivery profile as a value: what it refuses when it is set, how it renders a file name, and that
a stored profile reads back as the profile that was stored."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from app.delivery.errors import ProfileError
from app.delivery.profile import (
    DEFAULT_PROFILE,
    MAX_FILE_NAME_BYTES,
    Column,
    Compression,
    Format,
    LineEnding,
    Marker,
    Profile,
    Quoting,
    attribute_name_problem,
    tenant_slug,
)

CREATED = datetime(2026, 12, 1, 23, 30, 5, tzinfo=UTC)


def test_the_default_profile_is_the_file_every_export_was_before_profiles():
    assert [(c.source, c.header) for c in DEFAULT_PROFILE.columns] == [
        ("email", "email"), ("full_name", "full_name"), ("company", "company"), ("phone", "phone")]
    assert (DEFAULT_PROFILE.format, DEFAULT_PROFILE.delimiter, DEFAULT_PROFILE.header, DEFAULT_PROFILE.line_ending,
            DEFAULT_PROFILE.bom, DEFAULT_PROFILE.compression) == (Format.CSV, ",", True, LineEnding.LF, False,
                                                                  Compression.NONE)
    assert DEFAULT_PROFILE.render_file_name(delivery_key="k1", tenant_name="Acme", created_at=CREATED) == \
        "contacts-k1.csv"


def test_a_profile_reads_back_from_its_json_as_the_profile_stored_and_an_empty_object_as_the_default():
    profile = Profile.checked(columns=(Column("email", "E-Mail"), Column("attributes.tier", "Tier")),
                              format=Format.CSV, delimiter=";", quoting=Quoting.ALL, header=False,
                              line_ending=LineEnding.CRLF, bom=True, neutralize_formulas=True,
                              compression=Compression.GZIP, file_name="{tenant}_{created:%Y-%m-%d}_{sequence:06d}.csv",
                              time_zone="Europe/Berlin")

    assert Profile.from_json(profile.to_json()) == profile
    assert Profile.from_json({}) == DEFAULT_PROFILE


def test_a_setting_a_later_release_added_survives_a_round_trip_through_this_one():
    stored = {**DEFAULT_PROFILE.to_json(), "marker": "manifest"}

    assert Profile.from_json(stored).to_json() == stored


@pytest.mark.parametrize(("text", "source", "header"), [
    ("email", "email", "email"),
    ("email=E-Mail Address", "email", "E-Mail Address"),
    ("attributes.Lead Source (2024)", "attributes.Lead Source (2024)", "Lead Source (2024)"),
    ("attributes.tier=Tier=Gold", "attributes.tier", "Tier=Gold"),   # the first = separates
    ("full_name=Имя", "full_name", "Имя"),
])
def test_a_column_is_a_source_and_the_header_the_partner_wants(text, source, header):
    column = Column.parse(text)

    assert (column.source, column.header) == (source, header)


@pytest.mark.parametrize(("text", "says"), [
    ("password", "unknown column"),
    ("attributes.", "is empty"),
    ("attributes.x'); DROP TABLE contacts;--", "no quotes, semicolons"),
    ('attributes.a"b', "no quotes"),
    ("attributes. padded", "must start with a letter or digit"),
    ("attributes." + "a" * 65, "longer than 64"),
    ("email=", "header must be 1 to 128"),
    ("email=line\nbreak", "without control characters"),
])
def test_a_column_that_names_no_field_or_holds_sql_or_control_characters_is_refused_in_one_line(text, says):
    with pytest.raises(ProfileError) as refused:
        Column.parse(text)

    message = str(refused.value)
    assert says in message and "\n" not in message


def test_a_refusal_shows_a_hostile_value_escaped_on_one_line():
    with pytest.raises(ProfileError) as refused:
        Column.parse("secret\x1b[2J\nname")

    assert "\n" not in str(refused.value) and "\x1b" not in str(refused.value)


def test_two_columns_under_one_header_are_refused():
    with pytest.raises(ProfileError, match="names two columns"):
        Profile.checked(columns=(Column("email", "id"), Column("phone", "id")))


@pytest.mark.parametrize("delimiter", ['"', "\n", "ab", "", "é", "a", "7", " "])
def test_a_delimiter_that_is_not_one_ascii_punctuation_character_or_tab_is_refused(delimiter):
    with pytest.raises(ProfileError, match="delimiter"):
        Profile.checked(delimiter=delimiter)


@pytest.mark.parametrize("delimiter", [",", ";", "|", "\t"])
def test_common_delimiters_are_taken(delimiter):
    assert Profile.checked(delimiter=delimiter).delimiter == delimiter


def test_formula_neutralising_and_a_bom_are_refused_for_json_lines():
    with pytest.raises(ProfileError, match="JSON Lines"):
        Profile.checked(format=Format.JSONL, neutralize_formulas=True)
    with pytest.raises(ProfileError, match="byte order mark"):
        Profile.checked(format=Format.JSONL, bom=True)


def test_an_unknown_time_zone_is_refused():
    with pytest.raises(ProfileError, match="unknown time zone"):
        Profile.checked(time_zone="Mars/Olympus_Mons")


@pytest.mark.parametrize(("template", "says"), [
    ("../{delivery_key}.csv", "no path separators"),
    ("..{delivery_key}.csv", "start with a dot"),
    ("in/{delivery_key}.csv", "no path separators"),
    ("in\\{delivery_key}.csv", "no path separators"),
    (".{delivery_key}.csv", "start with a dot"),
    ("{delivery_key}..csv", "hold '..'"),
    ("contacts.csv", "needs {delivery_key} or {sequence}"),
    ("{delivery_key}{unknown}.csv", "unknown placeholder"),
    ("{delivery_key!r}.csv", "unknown placeholder"),
    ("{created:%Y/%m}-{delivery_key}.csv", "is not allowed"),
    ("{created:%s}-{delivery_key}.csv", "is not allowed"),
    ("{sequence:>10}.csv", "is not allowed"),
    ("{sequence:6d}.csv", "is not allowed"),   # a width pads with spaces unless it starts with 0
    ("{delivery_key", "a placeholder is"),
    ("x" * 200 + "{delivery_key}.csv", f"at most {MAX_FILE_NAME_BYTES}"),
    ("{delivery_key}:{tenant}.csv", "no path separators"),
    ("{delivery_key}.csv\x00", "no path separators"),
    (" {delivery_key}.csv", "start or end with a space"),
])
def test_a_template_that_could_render_a_path_a_hidden_name_a_shared_name_or_too_long_a_name_is_refused(
        template, says):
    with pytest.raises(ProfileError) as refused:
        Profile.checked(file_name=template)

    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_template_renders_the_key_the_tenant_slug_the_creation_date_in_its_zone_and_the_sequence():
    profile = Profile.checked(file_name="{tenant}_{created}_{created:%H%M}_{sequence:06d}_{delivery_key}.csv",
                              time_zone="Asia/Tokyo")

    name = profile.render_file_name(delivery_key="abc", tenant_name="Zoë & Co. GmbH", created_at=CREATED, sequence=42)

    # 23:30 UTC on the 1st is 08:30 on the 2nd in Tokyo.
    assert name == "zoe-co-gmbh_20261202_0830_000042_abc.csv"
    assert profile.uses_sequence and not DEFAULT_PROFILE.uses_sequence


@pytest.mark.parametrize(("name", "slug"), [("Acme", "acme"), ("  --  ", "tenant"), ("山田商事", "tenant"),
                                            ("A" * 80, "a" * 40), ("../../etc", "etc")])
def test_a_tenant_slug_is_ascii_letters_digits_and_hyphens(name, slug):
    assert tenant_slug(name) == slug


@pytest.mark.parametrize("name", ["tier", "Lead Source (2024)", "näme_1", "a/b#c&d+e-f.g"])
def test_attribute_names_a_crm_exports_are_names(name):
    assert attribute_name_problem(name) is None


@pytest.mark.parametrize("name", ["", " x", "x ", "a'b", "a;b", "a\tb", "-x", "_x", "a" * 65])
def test_attribute_names_that_need_escaping_somewhere_are_refused(name):
    assert attribute_name_problem(name) is not None


def test_describe_says_what_the_partner_receives():
    lines = Profile.checked(columns=(Column("email", "Email"),), compression=Compression.GZIP).describe()

    assert lines[0] == "columns: email=Email" and "gzip" in lines[2] and lines[3] == "encryption: none"
    assert "contacts-{delivery_key}.csv" in lines[4]


def test_a_manifest_names_the_file_its_bytes_sha256_rows_export_and_key_and_a_done_marker_is_empty():
    export_id = uuid.UUID("7f0c3a52-8a62-4c1e-9d0e-2b7e8f6a1c11")
    facts = dict(size=120, sha256=b"\x01" * 32, rows=3, export_id=export_id, delivery_key="k1")

    name, content = Profile.checked(marker=Marker.MANIFEST).marker_file("f.csv", **facts)

    assert name == "f.csv.manifest.json" and content.endswith(b"\n")
    assert json.loads(content) == {"name": "f.csv", "bytes": 120, "sha256": "01" * 32, "rows": 3,
                                   "export_id": str(export_id), "delivery_key": "k1"}
    # A function of what cutoff 2 records: the same facts give the same bytes, so they can be compared.
    assert Profile.checked(marker=Marker.MANIFEST).marker_file("f.csv", **facts)[1] == content
    assert Profile.checked(marker=Marker.DONE).marker_file("f.csv", **facts) == ("f.csv.done", b"")
    assert DEFAULT_PROFILE.marker_file("f.csv", **facts) is None

"""The argument types refuse hostile input before it reaches the database: control characters, text
that is not valid UTF-8 (lone surrogates, as Python decodes undecodable argv bytes), oversize and
empty values. The refusal itself is printable on one terminal line."""

from __future__ import annotations

import argparse
import uuid

import pytest

from app.cli.common import (
    MAX_NAME,
    MAX_TEXT,
    name,
    positive_int,
    printable,
    seconds_arg,
    status_arg,
    text,
    uuid_arg,
)
from app.store.types import Status

#: Inputs every text argument refuses: an operator's terminal or a script can send any of them.
HOSTILE_TEXT = {
    "nul": "al\x00ice",
    "escape": "al\x1b[31mice",
    "newline": "alice\nmallory",
    "carriage-return": "alice\rmallory",
    "delete": "alice\x7f",
    "lone-surrogates": "\udcff\udcfe bad bytes",
    "empty": "",
    "blank": "   ",
}


@pytest.mark.parametrize("value", HOSTILE_TEXT.values(), ids=HOSTILE_TEXT.keys())
def test_text_refuses_control_characters_invalid_utf8_and_empty_values(value):
    with pytest.raises(argparse.ArgumentTypeError):
        text()(value)


@pytest.mark.parametrize("value", HOSTILE_TEXT.values(), ids=HOSTILE_TEXT.keys())
def test_a_name_refuses_what_text_refuses(value):
    with pytest.raises(argparse.ArgumentTypeError):
        name(value)


def test_text_accepts_ordinary_unicode_up_to_its_limit():
    assert text()("Zanele Dlamini — Ω, Tomás") == "Zanele Dlamini — Ω, Tomás"
    assert text()("x" * MAX_TEXT) == "x" * MAX_TEXT


def test_text_refuses_one_character_over_its_limit_and_says_how_long_it_was():
    with pytest.raises(argparse.ArgumentTypeError, match=f"{MAX_TEXT + 1} characters"):
        text()("x" * (MAX_TEXT + 1))


def test_a_name_is_bounded_by_the_schemas_limit():
    assert name("n" * MAX_NAME) == "n" * MAX_NAME
    with pytest.raises(argparse.ArgumentTypeError):
        name("n" * (MAX_NAME + 1))
    with pytest.raises(argparse.ArgumentTypeError):
        name("x" * 10_240)


def test_text_allows_empty_only_when_asked():
    assert text(allow_empty=True)("") == ""
    with pytest.raises(argparse.ArgumentTypeError):
        text(allow_empty=True)("a\x00")


def test_a_uuid_is_parsed_and_anything_else_is_refused_in_printable_words():
    job_id = uuid.uuid4()
    assert uuid_arg(str(job_id)) == job_id
    for value in ("not-a-uuid", "123", "", "\x1b[2J" + str(job_id)):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            uuid_arg(value)
        assert "\x1b" not in str(refused.value)


def test_a_status_is_matched_without_regard_to_case_and_an_unknown_one_lists_the_choices():
    assert status_arg("queued") is Status.QUEUED
    assert status_arg("OUTCOMEUNKNOWN") is Status.OUTCOME_UNKNOWN
    for value in ("Finished", "", "Queued\x00"):
        with pytest.raises(argparse.ArgumentTypeError, match="one of: Queued, Running"):
            status_arg(value)


@pytest.mark.parametrize("value", ["0", "-1", "101", "1.5", "abc", "", "1e3", "\x00"])
def test_a_positive_int_refuses_anything_but_a_whole_number_in_range(value):
    with pytest.raises(argparse.ArgumentTypeError):
        positive_int(100)(value)


def test_a_positive_int_accepts_both_ends_of_its_range():
    assert (positive_int(100)("1"), positive_int(100)("100")) == (1, 100)


@pytest.mark.parametrize("value", ["0", "-1", "3601", "nan", "inf", "1e400", "two", ""])
def test_seconds_refuses_zero_negative_unbounded_and_non_numbers(value):
    with pytest.raises(argparse.ArgumentTypeError):
        seconds_arg(value)


def test_seconds_accepts_fractions_up_to_an_hour():
    assert (seconds_arg("0.2"), seconds_arg("3600")) == (0.2, 3600.0)


def test_printable_escapes_control_characters_and_undecodable_bytes_and_cuts_long_text():
    assert printable("a\x1bb\nc\td\udcff") == "a\\x1bb\\nc\\td\\udcff"
    cut = printable("x" * 1000, 300)
    assert cut.startswith("x" * 300) and cut.endswith("(1000 chars)") and "\n" not in cut

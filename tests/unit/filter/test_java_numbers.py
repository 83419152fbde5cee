"""The linear recognisers of Java number text agree with the regular expressions they replaced.

The regular expressions (backtracking, quadratic on a long digit run followed by a letter) stay here as the oracle:
they define what Sluice has always accepted, and on short inputs their cost does not matter.
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.filter import EvaluationError
from broker.filter.java_numbers import JAVA_TRIM, is_java_integer, java_double_text
from broker.filter.sql92 import java_parse_double, java_parse_int

ORACLE_INT = re.compile(r"[+-]?[0-9]+\Z")
ORACLE_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)\Z")


def oracle_double(text: str) -> float | None:
    """The value the replaced java_parse_double gave, None where it raised."""
    s = text.strip(JAVA_TRIM)
    if not ORACLE_DOUBLE.match(s):
        return None
    if s.endswith(("f", "F", "d", "D")) and not s.endswith("Infinity"):
        s = s[:-1]
    return float(s.replace("Infinity", "inf"))


def new_double(text: str) -> float | None:
    try:
        return java_parse_double(text)
    except EvaluationError:
        return None


def same_double(a: float | None, b: float | None) -> bool:
    """Equal as Java doubles: None with None, NaN with NaN, and the sign of a zero counts."""
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


# Characters that matter to either syntax, plus look-alikes Python's float() or int() would accept.
NUMBER_CHARS = "0123456789+-.eEfFdDxLN_ \t\x00\u0663\uff11"
NUMBER_PIECES = [*NUMBER_CHARS, "NaN", "Infinity", "inf", "nan", "1e", "0."]
number_texts = st.lists(st.sampled_from(NUMBER_PIECES), max_size=16).map("".join)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(number_texts, st.text(max_size=20)))
def test_double_recogniser_agrees_with_the_old_regex(text: str) -> None:
    assert same_double(new_double(text), oracle_double(text)), text
    assert (java_double_text(text) is not None) == (oracle_double(text) is not None), text


@settings(max_examples=1000, deadline=None)
@given(st.one_of(number_texts, st.text(max_size=20)))
def test_integer_recogniser_agrees_with_the_old_regex(text: str) -> None:
    assert is_java_integer(text) == bool(ORACLE_INT.match(text)), text


def test_every_short_text_over_the_number_alphabet_agrees() -> None:
    """Exhaustive up to four characters: every combination of sign, dot, exponent, suffix and digit."""
    alphabet = "01.eE+-fdN \u0663"
    for n in range(5):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            assert same_double(new_double(text), oracle_double(text)), text
            assert is_java_integer(text) == bool(ORACLE_INT.match(text)), text


@pytest.mark.parametrize(
    ("text", "value"),
    [("NaN", math.nan), ("-Infinity", -math.inf), ("+Infinity", math.inf), ("1.", 1.0), (".5", 0.5),
     ("1e3", 1000.0), ("1E+3", 1000.0), ("2.5e-1f", 0.25), ("7D", 7.0), ("\x00 -0.0 \t", -0.0), ("00012", 12.0)],
)
def test_java_double_spellings(text: str, value: float) -> None:
    assert same_double(java_parse_double(text), value)


@pytest.mark.parametrize(
    "text", ["NaNd", "Infinityf", "inf", "1_0", "1e", "1e+", ".", "e5", "1.2.3", "1ff", "0x1p3", "1 0", "\u0663", "+-1"]
)
def test_texts_java_refuses_as_double(text: str) -> None:
    with pytest.raises(EvaluationError, match="is not a number"):
        java_parse_double(text)


@pytest.mark.parametrize("text", ["", "+", "-", "1_0", " 1", "1 ", "\u0663", "1.0", "+-1", "0x1"])
def test_texts_java_refuses_as_integer(text: str) -> None:
    assert not is_java_integer(text)
    with pytest.raises(EvaluationError, match="is not an integer"):
        java_parse_int(text, long=True)

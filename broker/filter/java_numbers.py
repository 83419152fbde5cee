"""Which property strings Java reads as numbers, decided in one pass over the text.

A SQL92 filter converts a property to the literal's Java type (``Integer.valueOf``, ``Long.valueOf``,
``Double.valueOf``) and a message's properties may hold up to 32,767 bytes: the recognisers here take time linear
in the text and do their scanning in C (``str.isdigit``, ``str.partition``, ``str.strip``), so a conversion never
holds the interpreter lock for long. A backtracking regular expression for the double syntax
(``[0-9]+\\.?[0-9]*`` can split a digit run in n ways) took time quadratic in the run: 22 seconds on 30,000 digits
followed by one letter, during which no other broker thread ran.

Accepted syntax, ASCII only, as Sluice has always read these values:

- integer: ``[+-]?[0-9]+`` (no trimming, as ``Integer.valueOf``);
- double: after removing leading and trailing characters <= ``' '`` (``String.trim``), ``[+-]?`` then ``NaN``,
  ``Infinity``, or ``(digits [. [digits]] | . digits) [(e|E) [+-] digits] [f|F|d|D]``. Java's hexadecimal
  floats are not accepted.
"""

from __future__ import annotations

__all__ = ["JAVA_TRIM", "is_java_integer", "java_double_text"]

JAVA_TRIM = "".join(chr(c) for c in range(0x21))  # String.trim() removes every char <= ' '
_SIGNS = ("+", "-")
_SPECIAL = {"NaN": "nan", "Infinity": "inf"}  # Java's spellings, as Python's float() reads them
_SUFFIXES = ("f", "F", "d", "D")


def is_java_integer(text: str) -> bool:
    """Whether ``Integer.valueOf`` / ``Long.valueOf`` accept the syntax (``[+-]?[0-9]+``; range is not checked).

    For ASCII text ``isdigit`` is exactly 0-9 (``isascii`` is O(1)); one pass over the text.
    """
    if text.startswith(_SIGNS):
        text = text[1:]
    return text.isascii() and text.isdigit()


def java_double_text(text: str) -> str | None:
    """The text Python's ``float()`` reads as the value ``Double.valueOf(text)`` gives; None when Java throws.

    Linear in ``len(text)``: a trim, then the exponent and the fraction are split off with ``partition`` and the
    digits of each checked with ``isdigit``, every step one pass in C. ``float()`` itself would accept more
    (underscores, Unicode digits, "inf"), hence the checks before it.
    """
    s = text.strip(JAVA_TRIM)
    if s.isascii():  # the common cases first: plain digits, and digits '.' digits
        if s.isdigit():
            return s
        whole, _, fraction = s.partition(".")
        if whole.isdigit() and fraction.isdigit():
            return s
    body = s[1:] if s.startswith(_SIGNS) else s
    if body.endswith(_SUFFIXES):  # a float / double suffix, which NaN and Infinity cannot take
        body, s = body[:-1], s[:-1]
    elif (special := _SPECIAL.get(body)) is not None:
        return s[: len(s) - len(body)] + special
    mantissa, has_exponent, exponent = body.replace("E", "e").partition("e")
    if has_exponent:
        if exponent.startswith(_SIGNS):
            exponent = exponent[1:]
        if not (exponent.isascii() and exponent.isdigit()):
            return None
    whole, _, fraction = mantissa.partition(".")  # a second '.' stays in fraction and fails the digit check
    if not (mantissa.isascii() and (whole + fraction).isdigit()):  # at least one digit, on either side of '.'
        return None
    return s

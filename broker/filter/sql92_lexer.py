"""Tokens of RocketMQ's SQL92 message selector.

The token rules follow RocketMQ's ``SelectorParser.jj`` (itself ActiveMQ's JMS selector grammar, trimmed):

- keywords, case-insensitive: ``NOT AND OR BETWEEN IN TRUE FALSE NULL IS``;
- identifiers ``[a-zA-Z_$][a-zA-Z0-9_$]*`` (a property name);
- integer literals ``0 | [1-9][0-9]*`` with an optional ``L`` suffix (so ``007`` is three tokens, as in RocketMQ);
- decimal literals ``1.5``, ``1.``, ``.5``, ``1e10``, ``1.5E-3``;
- string literals in single quotes, a quote inside written twice (``'it''s'``);
- operators ``= <> < > <= >= ( ) , + -``; whitespace; ``-- line`` and ``/* block */`` comments.

The longest match wins; on a tie a keyword beats an identifier and an integer beats a decimal, as JavaCC does.
"""

from __future__ import annotations

import enum
import re
from typing import NamedTuple

from broker.errors import SubscriptionParseError

MAX_EXPRESSION_CHARS = 16 * 1024  # a subscription is evaluated per message: refuse pathological sizes up front


class SqlParseError(SubscriptionParseError):
    """A bad SQL92 expression: ``column`` is 1-based over the whole text, ``expected`` says what would fit there."""

    def __init__(self, expression: str, column: int, expected: str, found: str) -> None:
        self.expression = expression
        self.column = column
        self.expected = expected
        self.found = found
        shown = expression if len(expression) <= 200 else expression[:200] + "..."
        super().__init__(
            f"SQL92 filter {shown!r}: at column {column} expected {expected} but found {found}; "
            "fix the expression and subscribe again"
        )


class Kind(enum.Enum):
    KEYWORD = "keyword"
    IDENT = "property name"
    INTEGER = "integer"
    DECIMAL = "decimal"
    STRING = "string"
    OP = "operator"
    EOF = "end of expression"


class Token(NamedTuple):
    kind: Kind
    text: str  # keywords upper-cased; strings already unquoted; operators as written
    pos: int  # 0-based index of the first character in the expression

    def describe(self) -> str:
        if self.kind is Kind.EOF:
            return "the end of the expression"
        if self.kind is Kind.STRING:
            return f"string '{self.text}'"
        return f"{self.kind.value} {self.text!r}"


KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})
OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "(", ")", ",", "+", "-")  # two-character ones first

_WHITESPACE = " \t\n\r\f"
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_INTEGER = re.compile(r"(?:0|[1-9][0-9]*)[lL]?")
_EXPONENT = r"(?:[eE][+-]?[0-9]+)"
_DECIMAL = re.compile(rf"[0-9]+\.[0-9]*{_EXPONENT}?|\.[0-9]+{_EXPONENT}?|[0-9]+{_EXPONENT}")
_STRING = re.compile(r"'(?:''|[^'])*'")


def _skip_blank(text: str, i: int) -> int:
    """Index of the next character that is not whitespace or inside a comment."""
    n = len(text)
    while i < n:
        c = text[i]
        if c in _WHITESPACE:
            i += 1
        elif text.startswith("--", i):
            # RocketMQ needs a newline to end a line comment; we also accept the end of the text.
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise SqlParseError(text, i + 1, "'*/' closing the comment", "the end of the expression")
            i = end + 2
        else:
            break
    return i


def _number_token(text: str, i: int) -> Token | None:
    integer = _INTEGER.match(text, i)
    decimal = _DECIMAL.match(text, i)
    int_len = integer.end() - i if integer else 0
    dec_len = decimal.end() - i if decimal else 0
    if int_len == 0 and dec_len == 0:
        return None
    if int_len >= dec_len:
        assert integer is not None
        return Token(Kind.INTEGER, integer.group(), i)
    assert decimal is not None
    return Token(Kind.DECIMAL, decimal.group(), i)


def tokenize(text: str) -> list[Token]:
    """All tokens of ``text``, ending with one EOF token; SqlParseError on a character no token can start with."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise SqlParseError(
            text[:200], MAX_EXPRESSION_CHARS + 1, f"at most {MAX_EXPRESSION_CHARS} characters", f"{len(text)}"
        )
    tokens: list[Token] = []
    i = _skip_blank(text, 0)
    while i < len(text):
        c = text[i]
        tok: Token | None
        if c == "'":
            m = _STRING.match(text, i)
            if m is None:
                raise SqlParseError(text, i + 1, "a closing ' for this string", "the end of the expression")
            tok = Token(Kind.STRING, m.group()[1:-1].replace("''", "'"), i)
            i = m.end()
        elif c.isascii() and (c.isdigit() or (c == "." and i + 1 < len(text) and text[i + 1].isdigit())):
            tok = _number_token(text, i)
            assert tok is not None
            i += len(tok.text)
        elif (m := _IDENT.match(text, i)) is not None:
            word = m.group()
            upper = word.upper()
            tok = Token(Kind.KEYWORD, upper, i) if upper in KEYWORDS else Token(Kind.IDENT, word, i)
            i = m.end()
        else:
            op = next((o for o in OPERATORS if text.startswith(o, i)), None)
            if op is None:
                raise SqlParseError(
                    text, i + 1, "a property, a literal, an operator (= <> < > <= >=) or a parenthesis", repr(c)
                )
            tok = Token(Kind.OP, op, i)
            i += len(op)
        tokens.append(tok)
        i = _skip_blank(text, i)
    tokens.append(Token(Kind.EOF, "", len(text)))
    return tokens

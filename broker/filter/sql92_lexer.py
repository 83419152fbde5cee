"""Tokens of RocketMQ's SQL92 message selector.

The token rules follow RocketMQ's ``SelectorParser.jj`` (itself ActiveMQ's JMS selector grammar, trimmed):

- keywords, case-insensitive: ``NOT AND OR BETWEEN IN TRUE FALSE NULL IS``;
- identifiers ``[a-zA-Z_$][a-zA-Z0-9_$]*`` (a property name);
- integer literals ``0 | [1-9][0-9]*`` with an optional ``L`` suffix (so ``007`` is three tokens, as in RocketMQ);
- decimal literals ``1.5``, ``1.``, ``.5``, ``1e10``, ``1.5E-3``;
- string literals in single quotes, a quote inside written twice (``'it''s'``);
- operators ``= <> < > <= >= ( ) , + -``; whitespace; ``-- line`` and ``/* block */`` comments.

The longest match wins; on a tie a keyword beats an identifier and an integer beats a decimal, as JavaCC does.

Tokenizing takes time linear in the text (at most ``MAX_EXPRESSION_CHARS``): every scan moves forward, numbers are
scanned by hand (``_NumberScanner``), and in the regular expressions left (``_IDENT``, ``_STRING``, ``_DIGIT_RUN``)
each repetition has one way to go on, so a match backtracks at most over what it scanned once (and a string with
no closing quote ends the tokenizing).
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


class TokenKind(enum.Enum):
    KEYWORD = "keyword"
    IDENT = "property name"
    INTEGER = "integer"
    DECIMAL = "decimal"
    STRING = "string"
    OP = "operator"
    EOF = "end of expression"


class Token(NamedTuple):
    kind: TokenKind
    text: str  # keywords upper-cased; strings already unquoted; operators as written
    pos: int  # 0-based index of the first character in the expression

    def describe(self) -> str:
        if self.kind is TokenKind.EOF:
            return "the end of the expression"
        if self.kind is TokenKind.STRING:
            return f"string '{self.text}'"
        return f"{self.kind.value} {self.text!r}"


KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})
OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "(", ")", ",", "+", "-")  # two-character ones first

_WHITESPACE = " \t\n\r\f"
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_STRING = re.compile(r"'(?:''|[^'])*'")
_DIGIT_RUN = re.compile(r"[0-9]*")  # one greedy class with nothing after it: a single forward pass


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


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


class _NumberScanner:
    """Number tokens of one expression: ``0 | [1-9][0-9]* [lL]`` (integer) or ``[0-9]+ . [0-9]* [exp]``,
    ``. [0-9]+ [exp]``, ``[0-9]+ exp`` (decimal), ``exp`` being ``[eE][+-]?[0-9]+``; the longer wins, an integer
    on a tie.

    Which one a digit run starts depends on what follows the whole run ('.' or an exponent: ``007.5`` is one
    decimal), yet ``0000`` is four integer tokens: the run's end is remembered, so a run of n zeros costs O(n)
    rather than one scan of the rest of the run per token, O(n^2) (3 s for 16 KiB of zeros).
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.run_start = self.run_end = -1  # the leading digit run measured last

    def _lead_run_end(self, i: int) -> int:
        if not self.run_start <= i < self.run_end:  # every position inside a run has the same run end
            self.run_start, self.run_end = i, _digits_end(self.text, i)
        return self.run_end

    def _exponent_end(self, j: int) -> int:
        """End of ``[eE][+-]?[0-9]+`` at j, or j when there is none."""
        text = self.text
        if j >= len(text) or text[j] not in "eE":
            return j
        k = j + 2 if j + 1 < len(text) and text[j + 1] in "+-" else j + 1
        end = _digits_end(text, k)
        return end if end > k else j

    def token(self, i: int) -> Token:
        """The number token at i, where text[i] is an ASCII digit, or '.' followed by one."""
        text = self.text
        if text[i] == ".":
            return Token(TokenKind.DECIMAL, text[i : self._exponent_end(_digits_end(text, i + 1))], i)
        run = self._lead_run_end(i)
        int_end = i + 1 if text[i] == "0" else run
        if int_end < len(text) and text[int_end] in "lL":
            int_end += 1
        if run < len(text) and text[run] == ".":
            dec_end = self._exponent_end(_digits_end(text, run + 1))
        else:
            dec_end = self._exponent_end(run)
            if dec_end == run:  # digits alone are no decimal
                dec_end = i
        if int_end >= dec_end:
            return Token(TokenKind.INTEGER, text[i:int_end], i)
        return Token(TokenKind.DECIMAL, text[i:dec_end], i)


def _digits_end(text: str, i: int) -> int:
    """End of the run of ASCII digits starting at i (i itself when there is none)."""
    match = _DIGIT_RUN.match(text, i)
    assert match is not None  # [0-9]* matches everywhere
    return match.end()


def tokenize(text: str) -> list[Token]:
    """All tokens of ``text``, ending with one EOF token; SqlParseError on a character no token can start with."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise SqlParseError(
            text[:200], MAX_EXPRESSION_CHARS + 1, f"at most {MAX_EXPRESSION_CHARS} characters", f"{len(text)}"
        )
    tokens: list[Token] = []
    numbers = _NumberScanner(text)
    i = _skip_blank(text, 0)
    while i < len(text):
        c = text[i]
        tok: Token | None
        if c == "'":
            m = _STRING.match(text, i)
            if m is None:
                raise SqlParseError(text, i + 1, "a closing ' for this string", "the end of the expression")
            tok = Token(TokenKind.STRING, m.group()[1:-1].replace("''", "'"), i)
            i = m.end()
        elif _is_digit(c) or (c == "." and i + 1 < len(text) and _is_digit(text[i + 1])):
            tok = numbers.token(i)
            i += len(tok.text)
        elif (m := _IDENT.match(text, i)) is not None:
            word = m.group()
            upper = word.upper()
            tok = Token(TokenKind.KEYWORD, upper, i) if upper in KEYWORDS else Token(TokenKind.IDENT, word, i)
            i = m.end()
        else:
            op = next((o for o in OPERATORS if text.startswith(o, i)), None)
            if op is None:
                raise SqlParseError(
                    text, i + 1, "a property, a literal, an operator (= <> < > <= >=) or a parenthesis", repr(c)
                )
            tok = Token(TokenKind.OP, op, i)
            i += len(op)
        tokens.append(tok)
        i = _skip_blank(text, i)
    tokens.append(Token(TokenKind.EOF, "", len(text)))
    return tokens

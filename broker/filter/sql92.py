"""RocketMQ's SQL92 property filter, compiled once into Python closures.

    f = compile_sql92("region IN ('eu', 'us') AND price BETWEEN 10 AND 99.5")
    f.matches({"region": "eu", "price": "12"})      # True
    store.get_message(..., message_filter=f)        # f(msg) evaluates msg.properties

Semantics are RocketMQ's (``ComparisonExpression`` with string conversion on, ``LogicExpression``,
``UnaryExpression``), which a consumer moving from RocketMQ must see unchanged:

- A property value is always a string (or absent = NULL). Compared with a literal it is converted to the
  literal's Java type: an integer literal in 32-bit range parses the property as a Java ``int``, a larger one as a
  ``long``, a decimal literal as a ``double`` (Java ``Double.valueOf`` syntax), TRUE/FALSE as Java
  ``Boolean.valueOf`` (``"true"`` in any case is TRUE, anything else FALSE). Two properties compared with
  ``< > <= >=`` are both parsed as doubles; with ``=`` they compare as strings.
- A property that does not parse as the literal's type makes the whole evaluation fail, and a failed
  evaluation does not match (RocketMQ logs and skips the message). ``a > 5`` with ``a = "x"`` never matches,
  and neither does ``NOT (a > 5)``.
- Three-valued logic: a comparison with an absent property is NULL; NOT NULL is NULL; ``FALSE AND NULL`` is FALSE,
  ``TRUE OR NULL`` is TRUE; only TRUE matches. ``x = y`` with x present and y absent is FALSE (RocketMQ's rule).
- ``IN`` compares strings exactly; ``IS [NOT] NULL`` tests presence.

Compiled filters are immutable and thread-safe; ``compile_sql92`` caches the last few hundred expressions.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable, Mapping

from broker.filter.sql92_lexer import SqlParseError
from broker.filter.sql92_parser import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    MAX_LONG_DIGITS,
    And,
    BoolCast,
    Compare,
    Const,
    Equal,
    In,
    JLong,
    Negate,
    Node,
    Not,
    Or,
    Prop,
    Value,
    parse,
)
from broker.store.message import StoredMessage

log = logging.getLogger(__name__)

Props = Mapping[str, str]
Eval = Callable[[Props], Value]

__all__ = ["EvaluationError", "SqlFilter", "SqlParseError", "compile_sql92", "java_parse_double", "java_parse_int"]


class EvaluationError(Exception):
    """A value could not be converted for a comparison (RocketMQ's NumberFormatException): the message is skipped.

    Internal to evaluation: ``SqlFilter.matches`` turns it into "no match" and never lets it escape.
    """


# --------------------------------------------------------------------------------------- Java number parsing

_JAVA_INT = re.compile(r"[+-]?[0-9]+\Z")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)\Z")
_JAVA_TRIM = "".join(chr(c) for c in range(0x21))  # String.trim(): every char <= ' '


def java_parse_int(text: str, long: bool) -> int:
    """Java ``Integer.valueOf`` (``long=False``) or ``Long.valueOf``; EvaluationError when Java would throw."""
    if not _JAVA_INT.match(text):
        raise EvaluationError(f"{text[:40]!r} is not an integer")
    # Leading zeros count for int()'s 4300-digit limit (a ValueError) but not for Java: convert without them.
    magnitude = text.lstrip("+-").lstrip("0") or "0"
    if len(magnitude) > MAX_LONG_DIGITS:
        raise EvaluationError(f"{text[:40]!r} is out of range")
    value = -int(magnitude) if text.startswith("-") else int(magnitude)
    lo, hi = (LONG_MIN, LONG_MAX) if long else (INT_MIN, INT_MAX)
    if not lo <= value <= hi:
        raise EvaluationError(f"{text[:40]!r} is out of range")
    return JLong(value) if long else value


def java_parse_double(text: str) -> float:
    """Java ``Double.valueOf`` for decimal text (hexadecimal floats are not accepted)."""
    s = text.strip(_JAVA_TRIM)
    if not _JAVA_DOUBLE.match(s):
        raise EvaluationError(f"{text[:40]!r} is not a number")
    if s.endswith(("f", "F", "d", "D")) and not s.endswith("Infinity"):
        s = s[:-1]
    return float(s.replace("Infinity", "inf"))


def _java_boolean(text: str) -> bool:
    return text.lower() == "true"


# --------------------------------------------------------------------------------------- Java comparisons


def _cmp_double(a: float, b: float) -> int:
    """Java ``Double.compareTo``: NaN is above everything and equal to itself; -0.0 < 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = math.isnan(a), math.isnan(b)
    if a_nan or b_nan:
        return int(a_nan) - int(b_nan)
    return int(math.copysign(1, a) > 0) - int(math.copysign(1, b) > 0)  # equal values: only zeros' signs differ


def _convert(lv: object, rv: object) -> tuple[object, object] | None:
    """RocketMQ's cross-type conversion before ``compareTo``; None when it answers -1 without comparing."""
    lt, rt = type(lv), type(rv)
    if lt is bool:
        if rt is str:
            raise EvaluationError("a boolean cannot be compared with a string in this order")  # Java ClassCastException
        return None
    if lt is int or lt is JLong:
        if rt is int or rt is JLong:
            return lv, rv
        if rt is float:
            return float(lv), rv  # type: ignore[arg-type]
        if rt is str:
            return lv, java_parse_int(rv, long=lt is JLong)  # type: ignore[arg-type]
        return None
    if lt is float:
        if rt is int or rt is JLong:
            return lv, float(rv)  # type: ignore[arg-type]
        if rt is str:
            return lv, java_parse_double(rv)  # type: ignore[arg-type]
        return None
    if lt is str:
        if rt is bool:
            return _java_boolean(lv), rv  # type: ignore[arg-type]
        if rt is int or rt is JLong:
            return java_parse_int(lv, long=rt is JLong), rv  # type: ignore[arg-type]
        if rt is float:
            return java_parse_double(lv), rv  # type: ignore[arg-type]
    return None


def java_compare(lv: object, rv: object) -> int:
    """RocketMQ's ``ComparisonExpression.__compare`` with string conversion on: sign of lv - rv."""
    if type(lv) is not type(rv):
        converted = _convert(lv, rv)
        if converted is None:
            return -1
        lv, rv = converted
    if type(lv) is float or type(rv) is float:
        return _cmp_double(float(lv), float(rv))  # type: ignore[arg-type]
    return (lv > rv) - (lv < rv)  # type: ignore[operator]


def _java_equals(lv: object, rv: object) -> bool:
    if type(lv) is not type(rv):
        return False
    if type(lv) is float:
        return _cmp_double(lv, rv) == 0  # type: ignore[arg-type]
    return lv == rv


_OP_TEST: dict[str, Callable[[int], bool]] = {
    "<": lambda c: c < 0,
    ">": lambda c: c > 0,
    "<=": lambda c: c <= 0,
    ">=": lambda c: c >= 0,
}


# --------------------------------------------------------------------------------------- compilation


def _compile(node: Node) -> Eval:
    if isinstance(node, Const):
        value = node.value
        return lambda p: value
    if isinstance(node, Prop):
        name = node.name
        return lambda p: p.get(name)
    if isinstance(node, Negate):
        return _compile_negate(_compile(node.operand))
    if isinstance(node, Not):
        return _compile_not(_compile(node.operand))
    if isinstance(node, BoolCast):
        name = node.prop.name
        return lambda p: None if p.get(name) is None else False
    if isinstance(node, And):
        return _compile_and(tuple(_compile(operand) for operand in node.operands))
    if isinstance(node, Or):
        return _compile_or(tuple(_compile(operand) for operand in node.operands))
    if isinstance(node, Equal):
        return _compile_equal(node)
    if isinstance(node, Compare):
        return _compile_compare(node)
    if isinstance(node, In):
        return _compile_in(node)
    raise AssertionError(f"unknown node {node!r}")


def _compile_negate(f: Eval) -> Eval:
    def negate(p: Props) -> Value:
        v = f(p)
        if type(v) is JLong:
            return JLong(-v)
        if type(v) is int:
            return -v if v != INT_MIN else v
        if type(v) is float:
            return -v
        return None  # RocketMQ: negating a non-number gives NULL

    return negate


def _compile_not(f: Eval) -> Eval:
    def not_(p: Props) -> Value:
        v = f(p)
        return None if v is None else not v

    return not_


def _compile_and(operands: tuple[Eval, ...]) -> Eval:
    """Left to right, stopping at the first FALSE (so a later conversion failure does not count, as in RocketMQ's
    nested LogicExpression); NULL if any operand was NULL, else TRUE."""
    return _compile_logic(operands, decisive=False)


def _compile_or(operands: tuple[Eval, ...]) -> Eval:
    """Left to right, stopping at the first TRUE; NULL if any operand was NULL, else FALSE."""
    return _compile_logic(operands, decisive=True)


def _compile_logic(operands: tuple[Eval, ...], decisive: bool) -> Eval:
    """AND (``decisive`` FALSE) or OR (TRUE) over operands: the decisive value ends it, NULL taints the rest."""

    def logic(p: Props) -> Value:
        result: Value = not decisive
        for f in operands:
            v = f(p)
            if v is decisive:
                return decisive
            if v is None:
                result = None
        return result

    return logic


def _parser_for(value: Value) -> Callable[[str], object] | None:
    """How a property string is converted to compare with this literal (None: the generic path)."""
    if type(value) is int:
        return lambda s: java_parse_int(s, long=False)
    if type(value) is JLong:
        return lambda s: java_parse_int(s, long=True)
    if type(value) is float:
        return java_parse_double
    return None


def _compile_equal(node: Equal) -> Eval:
    left, right = node.left, node.right
    if isinstance(left, Prop) and isinstance(right, Const) and right.value is not None:
        return _compile_prop_equal(left.name, right.value)
    lf, rf = _compile(left), _compile(right)

    def equal(p: Props) -> Value:
        lv, rv = lf(p), rf(p)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        if lv is None or _java_equals(lv, rv):
            return True
        return java_compare(lv, rv) == 0

    return equal


def _compile_prop_equal(name: str, const: Value) -> Eval:
    """``prop = literal``, the common case, specialised: one dict lookup and at most one conversion."""
    if type(const) is str:
        return lambda p: None if (v := p.get(name)) is None else v == const
    if type(const) is bool:
        return lambda p: None if (v := p.get(name)) is None else _java_boolean(v) == const
    convert = _parser_for(const)
    assert convert is not None
    if type(const) is float:
        fconst = float(const)
        return lambda p: None if (v := p.get(name)) is None else _cmp_double(convert(v), fconst) == 0  # type: ignore[arg-type]
    return lambda p: None if (v := p.get(name)) is None else convert(v) == const


def _compile_compare(node: Compare) -> Eval:
    test = _OP_TEST[node.op]
    left, right = node.left, node.right
    if isinstance(left, Prop) and isinstance(right, Const):
        convert = _parser_for(right.value)
        if convert is not None:
            return _compile_prop_compare(left.name, right.value, convert, test)
    lf, rf = _compile(left), _compile(right)

    def compare(p: Props) -> Value:
        lv = lf(p)
        if lv is None:
            return None
        rv = rf(p)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            return test(_cmp_double(java_parse_double(lv), java_parse_double(rv)))
        return test(java_compare(lv, rv))

    return compare


def _compile_prop_compare(
    name: str, const: Value, convert: Callable[[str], object], test: Callable[[int], bool]
) -> Eval:
    if type(const) is float:
        fconst = float(const)

        def compare_float(p: Props) -> Value:
            v = p.get(name)
            return None if v is None else test(_cmp_double(convert(v), fconst))  # type: ignore[arg-type]

        return compare_float
    iconst = int(const)  # type: ignore[arg-type]

    def compare_int(p: Props) -> Value:
        v = p.get(name)
        if v is None:
            return None
        n: int = convert(v)  # type: ignore[assignment]
        return test((n > iconst) - (n < iconst))

    return compare_int


def _compile_in(node: In) -> Eval:
    name, values, negated = node.prop.name, node.values, node.negated
    return lambda p: None if (v := p.get(name)) is None else (v in values) != negated


# --------------------------------------------------------------------------------------- public API


class SqlFilter:
    """A compiled selector. ``matches(props)`` on a property map; calling it on a StoredMessage does the same."""

    __slots__ = ("_eval", "expression")

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self._eval = _compile(parse(expression))

    def evaluate(self, props: Props) -> bool | None:
        """TRUE, FALSE or None (NULL); EvaluationError when a conversion fails (RocketMQ would throw)."""
        v = self._eval(props)
        assert v is None or type(v) is bool, v
        return v

    def matches(self, props: Props) -> bool:
        """Whether the selector is TRUE for these properties. Never raises for what a message holds: a value the
        evaluation cannot handle means "does not match" (RocketMQ logs and skips it), since an error here would
        fail every pull over that message and the consumer could never move past it."""
        try:
            return self._eval(props) is True
        except EvaluationError as e:
            log.debug("SQL92 filter %r: %s; message skipped", self.expression, e)
            return False
        except (ValueError, ArithmeticError, RecursionError) as e:  # a conversion the evaluator did not foresee
            log.warning("SQL92 filter %r failed on a message (%r); message skipped", self.expression, e)
            return False

    def __call__(self, msg: StoredMessage) -> bool:
        return self.matches(msg.properties)

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


@functools.lru_cache(maxsize=512)
def compile_sql92(expression: str) -> SqlFilter:
    """Parse and compile once (cached); SqlParseError (SubscriptionParseError) with the column of the error."""
    return SqlFilter(expression)

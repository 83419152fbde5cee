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

Cost: parsing is linear in the expression (at most 16 KiB), and one evaluation is linear in the expression plus
the properties it reads (at most 32 KiB): a value is converted at most once per Java type an evaluation needs
(``Memo``), by the linear recognisers of ``java_numbers``. Comparing a property with a string literal reads at
most the literal; comparing two properties' strings (``a = b``) reads them each time, which at the limits (a
thousand ``a = b`` over two 16 KiB values that differ in their last character) costs about 2 ms.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping

from broker.filter.java_numbers import is_java_integer, java_double_text
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
    PropertyRef,
    Value,
    parse,
)
from broker.format.message import StoredMessage

log = logging.getLogger(__name__)

Props = Mapping[str, str]
# Conversions done in one evaluation, by (Java type, property text): an expression may compare the same property
# thousands of times (``a > 1.5 OR a > 2.5 OR ...``), and converting a 32 KB value each time would make one
# evaluation cost expression size x property size. A str caches its hash, so looking up the same value again is O(1).
# None when no property is compared twice (see _compares_a_property_twice).
Memo = dict[tuple[int, str], object]
Eval = Callable[[Props, Memo | None], Value]  # properties, this evaluation's conversions

__all__ = ["EvaluationError", "SqlFilter", "SqlParseError", "compile_sql92", "java_parse_double", "java_parse_int"]


class EvaluationError(Exception):
    """A value could not be converted for a comparison (RocketMQ's NumberFormatException): the message is skipped.

    Internal to evaluation: ``SqlFilter.matches`` turns it into "no match" and never lets it escape.
    """


# --------------------------------------------------------------------------------------- Java number parsing


def java_parse_int(text: str, long: bool) -> int:
    """Java ``Integer.valueOf`` (``long=False``) or ``Long.valueOf``; EvaluationError when Java would throw.

    Linear in ``len(text)`` (see ``java_numbers``); at most 19 significant digits reach ``int()``.
    """
    if not is_java_integer(text):
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
    """Java ``Double.valueOf`` for decimal text (hexadecimal floats are not accepted); linear in ``len(text)``."""
    decimal = java_double_text(text)
    if decimal is None:
        raise EvaluationError(f"{text[:40]!r} is not a number")
    return float(decimal)  # CPython's correctly rounded strtod: linear too, 0.02 ms for 30,000 digits


def _java_boolean(text: str) -> bool:
    """Java ``Boolean.valueOf``: "true" in any case. Only a 4-character string can lower-case to "true" (lower()
    never shortens a string, and its one expansion, U+0130, yields U+0307), so a long value costs nothing."""
    return len(text) == 4 and text.lower() == "true"


_INT, _LONG, _DOUBLE = 0, 1, 2  # the Java types a property string is converted to: Integer, Long, Double
_PARSE: tuple[Callable[[str], object], ...] = (
    lambda s: java_parse_int(s, long=False),
    lambda s: java_parse_int(s, long=True),
    java_parse_double,
)
_MISSING = object()


def _converted(kind: int, text: str, memo: Memo | None) -> object:
    """``text`` as the Java type ``kind`` (EvaluationError as Java would throw), converted once per evaluation.

    A failure is not remembered: it ends the evaluation (the message does not match).
    """
    if memo is None:
        return _PARSE[kind](text)
    key = (kind, text)
    value = memo.get(key, _MISSING)
    if value is _MISSING:
        value = memo[key] = _PARSE[kind](text)
    return value


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


def _convert(lv: object, rv: object, memo: Memo | None) -> tuple[object, object] | None:
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
            return lv, _converted(_LONG if lt is JLong else _INT, rv, memo)  # type: ignore[arg-type]
        return None
    if lt is float:
        if rt is int or rt is JLong:
            return lv, float(rv)  # type: ignore[arg-type]
        if rt is str:
            return lv, _converted(_DOUBLE, rv, memo)  # type: ignore[arg-type]
        return None
    if lt is str:
        if rt is bool:
            return _java_boolean(lv), rv  # type: ignore[arg-type]
        if rt is int or rt is JLong:
            return _converted(_LONG if rt is JLong else _INT, lv, memo), rv  # type: ignore[arg-type]
        if rt is float:
            return _converted(_DOUBLE, lv, memo), rv  # type: ignore[arg-type]
    return None


def java_compare(lv: object, rv: object, memo: Memo | None = None) -> int:
    """RocketMQ's ``ComparisonExpression.__compare`` with string conversion on: sign of lv - rv."""
    if type(lv) is not type(rv):
        converted = _convert(lv, rv, memo)
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
        return lambda p, m: value
    if isinstance(node, PropertyRef):
        name = node.name
        return lambda p, m: p.get(name)
    if isinstance(node, Negate):
        return _compile_negate(_compile(node.operand))
    if isinstance(node, Not):
        return _compile_not(_compile(node.operand))
    if isinstance(node, BoolCast):
        name = node.prop.name
        return lambda p, m: None if p.get(name) is None else False
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
    def negate(p: Props, m: Memo | None) -> Value:
        v = f(p, m)
        if type(v) is JLong:
            return JLong(-v)
        if type(v) is int:
            return -v if v != INT_MIN else v
        if type(v) is float:
            return -v
        return None  # RocketMQ: negating a non-number gives NULL

    return negate


def _compile_not(f: Eval) -> Eval:
    def not_(p: Props, m: Memo | None) -> Value:
        v = f(p, m)
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

    def logic(p: Props, m: Memo | None) -> Value:
        result: Value = not decisive
        for f in operands:
            v = f(p, m)
            if v is decisive:
                return decisive
            if v is None:
                result = None
        return result

    return logic


def _kind_for(value: Value) -> int | None:
    """The Java type a property string is converted to, to compare with this literal (None: the generic path)."""
    if type(value) is int:
        return _INT
    if type(value) is JLong:
        return _LONG
    if type(value) is float:
        return _DOUBLE
    return None


def _compile_equal(node: Equal) -> Eval:
    left, right = node.left, node.right
    if isinstance(left, PropertyRef) and isinstance(right, Const) and right.value is not None:
        return _compile_prop_equal(left.name, right.value)
    lf, rf = _compile(left), _compile(right)

    def equal(p: Props, m: Memo | None) -> Value:
        lv, rv = lf(p, m), rf(p, m)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        if lv is None or _java_equals(lv, rv):
            return True
        return java_compare(lv, rv, m) == 0

    return equal


def _compile_prop_equal(name: str, const: Value) -> Eval:
    """``prop = literal``, the common case, specialised: one dict lookup and at most one conversion."""
    if type(const) is str:
        return lambda p, m: None if (v := p.get(name)) is None else v == const
    if type(const) is bool:
        return lambda p, m: None if (v := p.get(name)) is None else _java_boolean(v) == const
    kind = _kind_for(const)
    assert kind is not None
    if kind == _DOUBLE:
        fconst = float(const)  # type: ignore[arg-type]
        return lambda p, m: (
            None if (v := p.get(name)) is None else _cmp_double(_converted(kind, v, m), fconst) == 0  # type: ignore[arg-type]
        )
    return lambda p, m: None if (v := p.get(name)) is None else _converted(kind, v, m) == const


def _compile_compare(node: Compare) -> Eval:
    test = _OP_TEST[node.op]
    left, right = node.left, node.right
    if isinstance(left, PropertyRef) and isinstance(right, Const):
        kind = _kind_for(right.value)
        if kind is not None:
            return _compile_prop_compare(left.name, right.value, kind, test)
    lf, rf = _compile(left), _compile(right)

    def compare(p: Props, m: Memo | None) -> Value:
        lv = lf(p, m)
        if lv is None:
            return None
        rv = rf(p, m)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            return test(_cmp_double(_converted(_DOUBLE, lv, m), _converted(_DOUBLE, rv, m)))  # type: ignore[arg-type]
        return test(java_compare(lv, rv, m))

    return compare


def _compile_prop_compare(name: str, const: Value, kind: int, test: Callable[[int], bool]) -> Eval:
    if kind == _DOUBLE:
        fconst = float(const)  # type: ignore[arg-type]

        def compare_float(p: Props, m: Memo | None) -> Value:
            v = p.get(name)
            return None if v is None else test(_cmp_double(_converted(kind, v, m), fconst))  # type: ignore[arg-type]

        return compare_float
    iconst = int(const)  # type: ignore[arg-type]

    def compare_int(p: Props, m: Memo | None) -> Value:
        v = p.get(name)
        if v is None:
            return None
        n: int = _converted(kind, v, m)  # type: ignore[assignment]
        return test((n > iconst) - (n < iconst))

    return compare_int


def _compile_in(node: In) -> Eval:
    name, values, negated = node.prop.name, node.values, node.negated
    return lambda p, m: None if (v := p.get(name)) is None else (v in values) != negated


def _compares_a_property_twice(root: Node) -> bool:
    """Whether a property is an operand of more than one comparison: only then can one evaluation convert the same
    value twice, and only then is a memo worth its cost (about 0.2 us an evaluation). A property under '-' is not
    converted (negating a string gives NULL)."""
    seen: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, And | Or):
            stack.extend(node.operands)
        elif isinstance(node, Not | Negate):
            stack.append(node.operand)
        elif isinstance(node, Equal | Compare):
            for side in (node.left, node.right):
                if not isinstance(side, PropertyRef):
                    stack.append(side)
                elif side.name in seen:
                    return True
                else:
                    seen.add(side.name)
    return False


# --------------------------------------------------------------------------------------- public API


class SqlFilter:
    """A compiled selector. ``matches(props)`` on a property map; calling it on a StoredMessage does the same."""

    __slots__ = ("_eval", "expression")

    def __init__(self, expression: str) -> None:
        self.expression = expression
        tree = parse(expression)
        root = _compile(tree)
        if _compares_a_property_twice(tree):
            self._eval: Callable[[Props], Value] = lambda p: root(p, {})
        else:
            self._eval = lambda p: root(p, None)

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

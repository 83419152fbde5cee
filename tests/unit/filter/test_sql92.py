"""SQL92 selector: parsing errors with columns, RocketMQ's evaluation rules, and a property test."""

from __future__ import annotations

import random
import re
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.client import Message, Producer, PullConsumer
from broker.errors import BrokerError, ResponseCode, SubscriptionParseError
from broker.filter import EvaluationError, SqlParseError, compile_sql92
from broker.filter.sql92 import SqlFilter, java_parse_double, java_parse_int
from broker.filter.sql92_parser import MAX_DEPTH, MAX_NESTING
from broker.format.message import StoredMessage
from broker.server.broker_controller import BrokerController

# ------------------------------------------------------------------------------------------------ evaluation


CASES: list[tuple[str, dict[str, str], bool]] = [
    ("a = 1", {"a": "1"}, True),
    ("a = 1", {"a": "01"}, True),  # Java Integer.valueOf("01") == 1
    ("a = 1", {"a": "1.0"}, False),  # not an int: conversion fails, no match
    ("a = 1.0", {"a": "1"}, True),
    ("a = 1.0", {"a": "1e0"}, True),
    ("a = 'x'", {"a": "x"}, True),
    ("a = 'x'", {"a": "X"}, False),
    ("a <> 'x'", {"a": "y"}, True),
    ("a <> 'x'", {}, False),
    ("a <> 1", {"a": "abc"}, False),  # conversion error -> whole evaluation fails
    ("a > 5", {"a": "10"}, True),
    ("a > 5", {"a": "5"}, False),
    ("a > 5", {"a": "5.5"}, False),  # int literal: property must be an int
    ("a > 5.0", {"a": "5.5"}, True),
    ("a >= 5", {"a": "5"}, True),
    ("a < -5", {"a": "-6"}, True),
    ("a <= -5", {"a": "-5"}, True),
    ("a > 5", {}, False),
    ("a > 5", {"a": "x"}, False),
    ("NOT (a > 5)", {"a": "x"}, False),
    ("NOT (a > 5)", {}, False),
    ("NOT (a > 5)", {"a": "1"}, True),
    ("a > 3000000000", {"a": "3000000001"}, True),  # long literal: property parsed as a long
    ("a <> -2147483648", {"a": "2147483648"}, True),  # minus a long literal is a long: "2147483648" parses
    ("a > 5", {"a": "2147483648"}, False),  # int literal: overflow is a conversion error
    ("a > 1.5", {"a": " 2 "}, True),  # Double.valueOf trims
    ("a = 2", {"a": " 2 "}, False),  # Integer.valueOf does not
    ("a > 1.5", {"a": "NaN"}, True),  # Double.compareTo puts NaN above everything
    ("a = 0.0", {"a": "-0.0"}, False),  # ... and -0.0 below 0.0
    ("a = 5L", {"a": "5"}, True),
    ("a BETWEEN 1 AND 3", {"a": "2"}, True),
    ("a BETWEEN 1 AND 3", {"a": "3"}, True),
    ("a BETWEEN 1 AND 3", {"a": "4"}, False),
    ("a NOT BETWEEN 1 AND 3", {"a": "4"}, True),
    ("a NOT BETWEEN 1 AND 3", {"a": "2"}, False),
    ("a NOT BETWEEN 1 AND 3", {}, False),
    ("a IN ('x', 'y')", {"a": "y"}, True),
    ("a IN ('x', 'y')", {"a": "z"}, False),
    ("a IN ('x', 'y')", {}, False),
    ("a NOT IN ('x', 'y')", {"a": "z"}, True),
    ("a NOT IN ('x', 'y')", {}, False),
    ("a IN ('it''s')", {"a": "it's"}, True),
    ("a IS NULL", {}, True),
    ("a IS NULL", {"a": ""}, False),
    ("a IS NOT NULL", {"a": ""}, True),
    ("a is not null and a in ('x')", {"a": "x"}, True),  # keywords in any case
    ("flag = TRUE", {"flag": "true"}, True),
    ("flag = TRUE", {"flag": "TRUE"}, True),
    ("flag = TRUE", {"flag": "yes"}, False),
    ("flag = FALSE", {"flag": "yes"}, True),  # Boolean.valueOf("yes") is false
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NULL", {}, False),
    ("a", {"a": "true"}, False),  # a bare property is never a Boolean
    ("a = b", {"a": "x", "b": "x"}, True),
    ("a = b", {"a": "x"}, False),
    ("a = b", {"b": "x"}, False),
    ("a > b", {"a": "10", "b": "9"}, True),  # two properties: compared as doubles, not strings
    ("a > b", {"a": "x", "b": "9"}, False),
    ("a > 1 OR b = 'x'", {"a": "zz", "b": "x"}, False),  # the error on the left fails the evaluation
    ("b = 'x' OR a > 1", {"a": "zz", "b": "x"}, True),  # short-circuit: never evaluated
    ("b = 'y' AND a > 1", {"a": "zz", "b": "x"}, False),
    ("a = 1 AND b = 2 OR c = 3", {"c": "3"}, True),  # AND binds tighter than OR
    ("a = 1 AND (b = 2 OR c = 3)", {"c": "3"}, False),
    ("(a > 1) = TRUE", {"a": "2"}, True),
    ("NOT a = 1", {"a": "1"}, False),  # RocketMQ: (NOT a) = 1, never true
    ("a = -5", {"a": "-5"}, True),
    ("a = +5", {"a": "5"}, True),
    ("a = - -5", {"a": "5"}, True),
    ("a = .5", {"a": "0.5"}, True),
    ("a = 5.", {"a": "5"}, True),
    ("a = 1e2", {"a": "100"}, True),
    ("$x_1 = 'v'", {"$x_1": "v"}, True),
    ("a = 1 -- trailing comment", {"a": "1"}, True),
    ("a = /* inline */ 1", {"a": "1"}, True),
    ("TAGS IN ('TagA', 'TagB') AND a BETWEEN 0 AND 3", {"TAGS": "TagB", "a": "0"}, True),
]


@pytest.mark.parametrize(("expr", "props", "expected"), CASES)
def test_evaluation(expr: str, props: dict[str, str], expected: bool) -> None:
    assert compile_sql92(expr).matches(props) is expected


def test_three_valued_results() -> None:
    assert compile_sql92("a = 1").evaluate({}) is None
    assert compile_sql92("a = 1 AND FALSE").evaluate({}) is False
    assert compile_sql92("a = 1 OR TRUE").evaluate({}) is True
    assert compile_sql92("a = 1 OR FALSE").evaluate({}) is None
    assert compile_sql92("NOT (a = 1)").evaluate({}) is None
    with pytest.raises(EvaluationError):
        compile_sql92("a = 1").evaluate({"a": "x"})


def test_filter_on_stored_message_and_cache() -> None:
    f = compile_sql92("k = 'v'")
    assert compile_sql92("k = 'v'") is f
    msg = StoredMessage(topic="T", queue_id=0, queue_offset=0, commitlog_offset=0, body=b"", properties={"k": "v"})
    assert f(msg) is True
    assert isinstance(f, SqlFilter)


def test_java_number_parsing() -> None:
    assert java_parse_int("+12", long=False) == 12
    assert java_parse_int("-2147483648", long=False) == -(2**31)
    for bad in ("2147483648", "1.0", "", " 1", "1_0", "0x1"):
        with pytest.raises(EvaluationError):
            java_parse_int(bad, long=False)
    assert java_parse_int("9223372036854775807", long=True) == 2**63 - 1
    with pytest.raises(EvaluationError):
        java_parse_int("9223372036854775808", long=True)
    assert java_parse_double(" 1.5d ") == 1.5
    assert java_parse_double("-Infinity") == float("-inf")
    assert java_parse_double("1e400") == float("inf")
    for bad in ("inf", "1_0", "abc", "", "1e", "."):
        with pytest.raises(EvaluationError):
            java_parse_double(bad)


def test_filter_is_thread_safe() -> None:
    f = compile_sql92("a > 10 AND b IN ('x')")
    errors: list[str] = []

    def run(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(5000):
            a = rng.randint(0, 20)
            got = f.matches({"a": str(a), "b": "x"})
            if got != (a > 10):
                errors.append(f"a={a} got {got}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ------------------------------------------------------------------------------------------------ parse errors

ERRORS: list[tuple[str, int, str]] = [
    ("", 1, "property name"),
    ("a >", 4, "property name"),
    ("a > 'x'", 5, "number or a property"),
    ("a > TRUE", 5, "number or a property"),
    ("a > NULL", 5, "number or a property"),
    ("a > (b = 1)", 6, "number or a property"),
    ("a = NULL", 5, "IS NULL"),
    ("a == 1", 4, "property name"),
    ("a != 1", 3, "operator"),
    ("(a = 1", 7, "')' closing"),
    ("a = 1)", 6, "end of the expression"),
    ("a IN ()", 7, "string literal"),
    ("a IN (1)", 7, "string literal"),
    ("a IN ('x' 'y')", 11, "',' or ')'"),
    ("'x' IN ('x')", 1, "property name on the left of IN"),
    ("NOT a IN ('x')", 1, "property name on the left of IN"),
    ("a BETWEEN 3 AND 1", 11, "lower bound"),
    ("a BETWEEN 1 OR 3", 13, "AND between"),
    ("a = 'abc", 5, "closing '"),
    ("5", 1, "condition"),
    ("'x'", 1, "condition"),
    ("a = 1 AND 5", 11, "condition"),
    ("TRUE = 5", 8, "boolean"),
    ("a = 1 b = 2", 7, "AND, OR"),
    ("a = 007", 6, "AND, OR"),  # '0' then '07': RocketMQ's tokens
    ("a = 99999999999999999999", 5, "integer of at most"),
    ("a = 1 /* open", 7, "'*/'"),
    ("a # 1", 3, "operator"),
    ("a IS 1", 6, "NULL after IS"),
    ("a = --5", 8, "property name"),  # "--" starts a comment, as in RocketMQ
]


@pytest.mark.parametrize(("expr", "column", "expected"), ERRORS)
def test_parse_errors_name_column_and_expectation(expr: str, column: int, expected: str) -> None:
    with pytest.raises(SqlParseError) as info:
        compile_sql92(expr)
    err = info.value
    assert isinstance(err, SubscriptionParseError)
    assert err.code is ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert err.column == column, str(err)
    assert expected in err.expected, str(err)
    assert f"column {column}" in str(err)


def test_nesting_and_size_are_bounded() -> None:
    with pytest.raises(SqlParseError, match="nested"):
        compile_sql92("(" * 100 + "a = 1" + ")" * 100)
    assert compile_sql92("(" * 30 + "a = 1" + ")" * 30).matches({"a": "1"})
    with pytest.raises(SqlParseError, match="at most"):
        compile_sql92("a = 1 OR " * 3000 + "a = 2")


# ------------------------------------------------------------------------------------------------ property test
# An independent evaluator over a generated expression tree, written from the documented rules rather than from
# the implementation: each tree renders to SQL, both evaluate 10,000 messages, the answers must agree.

VALUE_POOL = [
    "0", "1", "-5", "42", "007", "3.5", "-0.0", "1e3", " 7 ", "abc", "", "x", "y", "true", "TRUE", "false",
    "2147483648", "-2147483649", "NaN", "99999999999999999999", "+3", "1.5f",
]
PROPS = ["a", "b", "c"]


class Err(Exception):
    pass


def t_int(s: str, long: bool) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", s):
        raise Err
    n = int(s)
    bound = 2**63 if long else 2**31
    if not -bound <= n < bound:
        raise Err
    return n


def t_double(s: str) -> float:
    s = s.strip("".join(map(chr, range(33))))
    m = re.fullmatch(r"([+-]?(?:NaN|Infinity|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))[fFdD]?", s)
    if not m:
        raise Err
    return float(m.group(1).replace("Infinity", "inf"))


def t_cmp_double(x: float, y: float) -> int:
    import math

    def key(v: float) -> tuple[int, float, int]:
        return (1, 0.0, 0) if math.isnan(v) else (0, v, 1 if math.copysign(1, v) > 0 else 0)

    kx, ky = key(x), key(y)
    return (kx > ky) - (kx < ky)


def t_eval(node: tuple, props: dict[str, str]) -> bool | None:  # type: ignore[type-arg]
    kind = node[0]
    if kind == "and":
        lv = t_eval(node[1], props)
        if lv is False:
            return False
        rv = t_eval(node[2], props)
        if rv is False:
            return False
        return None if None in (lv, rv) else True
    if kind == "or":
        lv = t_eval(node[1], props)
        if lv is True:
            return True
        rv = t_eval(node[2], props)
        if rv is True:
            return True
        return None if None in (lv, rv) else False
    if kind == "not":
        v = t_eval(node[1], props)
        return None if v is None else not v
    value = props.get(node[1])
    if kind == "isnull":
        return (value is None) != node[2]
    if kind == "in":
        return None if value is None else (value in node[2]) != node[3]
    if kind == "between":
        _, name, lo, hi, negated = node
        if negated:
            return t_eval(("or", ("cmp", name, "<", lo), ("cmp", name, ">", hi)), props)
        return t_eval(("and", ("cmp", name, ">=", lo), ("cmp", name, "<=", hi)), props)
    _, name, op, lit = node
    if value is None:
        return None
    if isinstance(lit, bool):
        c = 0 if (value.lower() == "true") == lit else 1
    elif isinstance(lit, str):
        c = 0 if value == lit else 1
    elif isinstance(lit, float):
        c = t_cmp_double(t_double(value), lit)
    else:
        n = t_int(value, long=abs(lit) > 2**31 - 1)  # "-2147483648" is minus a long literal: a long
        c = (n > lit) - (n < lit)
    return {"=": c == 0, "<>": c != 0, "<": c < 0, ">": c > 0, "<=": c <= 0, ">=": c >= 0}[op]


def t_matches(node: tuple, props: dict[str, str]) -> bool:  # type: ignore[type-arg]
    try:
        return t_eval(node, props) is True
    except Err:
        return False


def render(node: tuple) -> str:  # type: ignore[type-arg]
    kind = node[0]
    if kind in ("and", "or"):
        return f"({render(node[1])}) {kind.upper()} ({render(node[2])})"
    if kind == "not":
        return f"NOT ({render(node[1])})"
    if kind == "isnull":
        return f"{node[1]} IS {'NOT ' if node[2] else ''}NULL"
    if kind == "in":
        items = ", ".join("'" + v.replace("'", "''") + "'" for v in sorted(node[2]))
        return f"{node[1]} {'NOT ' if node[3] else ''}IN ({items})"
    if kind == "between":
        return f"{node[1]} {'NOT ' if node[4] else ''}BETWEEN {lit_sql(node[2])} AND {lit_sql(node[3])}"
    return f"{node[1]} {node[2]} {lit_sql(node[3])}"


def lit_sql(v: object) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


numbers = st.one_of(
    st.integers(-10, 50),
    st.sampled_from([2**31 - 1, 2**31, -(2**31), 2**40]),
    st.floats(-10, 50, allow_nan=False).map(lambda f: round(f, 2)),
)
prop_names = st.sampled_from(PROPS)
atoms = st.one_of(
    st.tuples(st.just("cmp"), prop_names, st.sampled_from(["=", "<>", "<", ">", "<=", ">="]), numbers),
    st.tuples(st.just("cmp"), prop_names, st.sampled_from(["=", "<>"]), st.sampled_from(VALUE_POOL) | st.booleans()),
    st.tuples(st.just("in"), prop_names, st.frozensets(st.sampled_from(VALUE_POOL), min_size=1, max_size=4),
              st.booleans()),
    st.tuples(st.just("isnull"), prop_names, st.booleans()),
    st.tuples(st.just("between"), prop_names, st.integers(-10, 10), st.integers(10, 50), st.booleans()),
)
expressions = st.recursive(
    atoms,
    lambda kids: st.one_of(
        st.tuples(st.just("and"), kids, kids), st.tuples(st.just("or"), kids, kids), st.tuples(st.just("not"), kids)
    ),
    max_leaves=6,
)


def make_messages(n: int) -> list[dict[str, str]]:
    rng = random.Random(20261122)
    out = []
    for _ in range(n):
        props = {}
        for name in PROPS:
            r = rng.random()
            if r < 0.2:
                continue
            props[name] = rng.choice(VALUE_POOL) if r < 0.6 else str(rng.randint(-12, 55))
        out.append(props)
    return out


MESSAGES = make_messages(10_000)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions)
def test_matches_independent_evaluator_over_10000_messages(tree: tuple) -> None:  # type: ignore[type-arg]
    sql = render(tree)
    f = compile_sql92(sql)
    got = [f.matches(p) for p in MESSAGES]
    want = [t_matches(tree, p) for p in MESSAGES]
    mismatches = [(MESSAGES[i], got[i], want[i]) for i in range(len(MESSAGES)) if got[i] != want[i]]
    assert not mismatches, f"{sql}: {mismatches[:3]}"


# ------------------------------------------------------------------------------------------------ resource bounds
# A selector arrives with a pull: nothing in it, or in a message's properties, may make the broker fail the pull
# with SYSTEM_ERROR (a RecursionError or ValueError escaping) instead of a parse error or "no match".


@pytest.mark.parametrize("joiner", ["OR", "AND"])
def test_long_flat_and_or_chains_compile_and_evaluate(joiner: str) -> None:
    """~1500 terms (~14 KB, inside the size limit) nested one level per term and recursed past Python's limit."""
    terms = ["a = 2"] * 1500 + ["a = 1"] if joiner == "OR" else ["a > 0"] * 1500 + ["a = 1"]
    f = compile_sql92(f" {joiner} ".join(terms))
    assert f.matches({"a": "1"}) is True
    assert f.matches({"a": "3"}) is False
    assert f.evaluate({}) is None  # three-valued logic holds over the whole chain
    assert f.matches({"a": "x"}) is False  # a conversion failure anywhere in the chain: no match


def test_chains_keep_rocketmq_short_circuit_and_null_rules() -> None:
    assert compile_sql92("a = 1 OR b = 1 OR c = 1").evaluate({"c": "1"}) is True  # NULL OR NULL OR TRUE
    assert compile_sql92("a = 1 OR b = 1 OR c = 1").evaluate({"c": "2"}) is None
    assert compile_sql92("a = 1 AND b = 1 AND c = 1").evaluate({"a": "1", "b": "2"}) is False
    assert compile_sql92("a = 1 AND b = 1 AND c = 1").evaluate({"a": "1", "b": "1"}) is None
    # FALSE stops the chain before a conversion that would fail (as RocketMQ's LogicExpression does)
    assert compile_sql92("a = 2 AND b > 1 AND c = 1").evaluate({"a": "1", "b": "x"}) is False


@pytest.mark.parametrize(
    "expr",
    [
        "a" + " = a" * 1000,  # each '=' nests the left side one level deeper
        "a = 1" + " = TRUE" * 400,
        "a IS NULL" + " IS NOT NULL" * 300,
        "a <> 1" + " <> TRUE" * 200,
    ],
)
def test_deep_operator_chains_are_a_parse_error(expr: str) -> None:
    with pytest.raises(SqlParseError, match=f"at most {MAX_DEPTH} operators deep") as e:
        compile_sql92(expr)
    assert e.value.code is ResponseCode.SUBSCRIPTION_PARSE_FAILED


def test_deepest_allowed_expression_compiles_and_evaluates() -> None:
    """The depth bound leaves room for everything MAX_NESTING allows (parentheses each adding ``<> x``)."""
    expr = "a = 1"
    for _ in range(MAX_NESTING):
        expr = f"({expr}) <> FALSE"
    f = compile_sql92(expr)
    assert f.evaluate({"a": "1"}) is True and f.evaluate({"a": "2"}) is False
    chain = "a = 1" + " = TRUE" * (MAX_DEPTH - 1)
    assert compile_sql92(chain).matches({"a": "1"}) is True


def test_integer_literal_longer_than_pythons_int_limit_is_a_parse_error() -> None:
    """int() refuses strings over 4300 digits with a ValueError; the literal is out of Java's long range anyway."""
    with pytest.raises(SqlParseError, match="an integer of at most") as e:
        compile_sql92("a = " + "9" * 5000)
    assert e.value.column == 5


def test_property_with_thousands_of_digits_does_not_match() -> None:
    """RocketMQ: the conversion fails (NumberFormatException), the message does not match; the next one does."""
    huge = "1" * 5000
    for expr in ("a > 5", "a = 5", "a = 5000000000", "a < 5 OR b = 1", "5 < a", "a BETWEEN 1 AND 9"):
        f = compile_sql92(expr)
        assert f.matches({"a": huge, "b": "1"}) is False, expr
        with pytest.raises(EvaluationError):
            f.evaluate({"a": huge, "b": "1"})
    for text in (huge, "-" + huge, "+" + huge):
        with pytest.raises(EvaluationError, match="out of range"):
            java_parse_int(text, long=True)
    assert java_parse_int("0" * 5000 + "7", long=False) == 7  # Java accepts leading zeros: not a long number
    assert compile_sql92("a > 5").matches({"a": "0" * 5000 + "7"}) is True


def test_matches_never_lets_an_evaluation_problem_escape() -> None:
    f = SqlFilter("a > 5")

    def broken(props: object) -> bool:
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    f._eval = broken  # stands for any conversion the evaluator did not foresee
    assert f.matches({"a": "7"}) is False


def test_pulls_through_a_broker_skip_a_poison_message_and_refuse_a_deep_selector(broker: BrokerController) -> None:
    """Both failed the pull with SYSTEM_ERROR: every pull over the poison message, so its queue was stuck."""
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as p:
        p.send_batch([Message("Sql", b"poison", properties={"a": "1" * 5000}),
                      Message("Sql", b"good", properties={"a": "10"})], queue_id=0)
    assert broker.store is not None and broker.store.wait_dispatched()
    with PullConsumer(endpoint, "sql-g") as c:
        assert [m.body for m in c.pull("Sql", 0, 0, sql="a > 5").messages] == [b"good"]
        assert [m.body for m in c.pull("Sql", 0, 0, sql="a = 2 OR " * 1000 + "a = 10").messages] == [b"good"]
        for deep in ("a" + " = a" * 1000, "a = " + "9" * 5000):
            with pytest.raises(BrokerError) as e:
                c.pull("Sql", 0, 0, sql=deep)
            assert e.value.code is ResponseCode.SUBSCRIPTION_PARSE_FAILED, e.value.message

"""Parser of RocketMQ's SQL92 message selector into a small tree (``Node``), with RocketMQ's parse-time checks.

Grammar (RocketMQ ``SelectorParser.jj``; loosest binding first)::

    selector    := or_expr EOF                       -- must yield a boolean
    or_expr     := and_expr (OR and_expr)*
    and_expr    := equality (AND equality)*
    equality    := comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
    comparison  := unary ( ('>'|'>='|'<'|'<=') unary
                         | [NOT] BETWEEN unary AND unary
                         | [NOT] IN '(' string (',' string)* ')' )*
    unary       := '+' unary | '-' unary | NOT unary | primary
    primary     := literal | property | '(' or_expr ')'

Note, as in RocketMQ, NOT binds tighter than the comparisons: ``NOT a = 1`` is ``(NOT a) = 1``; write
``NOT (a = 1)`` or ``a <> 1``, and ``a NOT IN (...)`` / ``a NOT BETWEEN x AND y``.

Parse-time checks (RocketMQ's ``ComparisonExpression``): ``< > <= >= BETWEEN`` take no string, boolean or NULL
literal and no boolean sub-expression; ``=`` and ``<>`` take no NULL literal (use IS NULL); ``IN`` needs a property
on its left; ``BETWEEN x AND y`` with literal bounds needs x <= y; a lone property or a boolean expression is
needed where a condition is expected (a number or a string is not one).

Sluice's own bounds (a selector comes with every pull): at most ``MAX_NESTING`` nested parentheses / NOT / '-',
at most ``MAX_DEPTH`` nested operators in the tree, integer literals within Java's long range. AND / OR chains
are single n-ary nodes, so a long flat chain costs no depth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.filter.sql92_lexer import SqlParseError, Token, TokenKind, tokenize

MAX_NESTING = 64  # parentheses / NOT / minus depth: bounds the recursion of the parser
# Operators nested in the tree, which compilation and evaluation recurse through (up to 2 Python frames a level):
# chains of = / <> / IS NULL nest one level per operator without any parenthesis, so MAX_NESTING alone does not
# bound it. Room for MAX_NESTING parentheses each adding two levels (``(...) <> x``), far inside the interpreter's
# recursion limit (1000) even on a gRPC worker's stack. AND / OR chains are flat (n-ary) and do not nest.
MAX_DEPTH = 2 * MAX_NESTING + 32
# Java's Long.MAX_VALUE has 19 digits: a longer integer is out of range without converting it, which also keeps
# int() away from strings over Python's 4300-digit conversion limit (a ValueError).
MAX_LONG_DIGITS = len(str(1 << 63))


class JLong(int):
    """A Java ``Long`` value (an integer literal outside the 32-bit range); a plain ``int`` is a Java ``Integer``.

    RocketMQ converts a property to the literal's Java type before comparing, so the distinction changes results:
    ``a = 5`` parses ``a`` as a 32-bit int, ``a = 5000000000`` as a 64-bit long.
    """

    __slots__ = ()


# Literal values as RocketMQ's ConstantExpression holds them: None (NULL), bool, int (Integer), JLong, float
# (Double), str.
Value = None | bool | int | float | str


@dataclass(frozen=True, slots=True)
class Node:
    pos: int  # 0-based position in the expression, for error messages


@dataclass(frozen=True, slots=True)
class Const(Node):
    value: Value
    literal: bool = True  # False when folded from '-' literal: RocketMQ's checks do not see it as a constant


@dataclass(frozen=True, slots=True)
class PropertyRef(Node):
    name: str


@dataclass(frozen=True, slots=True)
class Negate(Node):
    operand: Node


@dataclass(frozen=True, slots=True)
class Not(Node):
    operand: Node


@dataclass(frozen=True, slots=True)
class BoolCast(Node):
    """A bare property used as a condition: NULL when absent, else FALSE (a property value is never a Boolean)."""

    prop: PropertyRef


@dataclass(frozen=True, slots=True)
class And(Node):
    """``a AND b AND c`` as one node over all its operands, evaluated left to right in a loop (a chain of
    thousands of terms would otherwise be a tree as deep as the chain)."""

    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or(Node):
    """``a OR b OR c`` as one node, like And."""

    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Equal(Node):
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Compare(Node):
    op: str  # one of < > <= >=
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class In(Node):
    prop: PropertyRef
    values: frozenset[str]
    negated: bool


BOOLEAN_NODES = (Not, BoolCast, And, Or, Equal, Compare, In)
COMPARE_OPS = frozenset({"<", ">", "<=", ">="})
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


def is_boolean(node: Node) -> bool:
    """RocketMQ's ``instanceof BooleanExpression``: conditions and the TRUE/FALSE/NULL literals."""
    if isinstance(node, Const):
        return node.literal and (node.value is None or isinstance(node.value, bool))
    return isinstance(node, BOOLEAN_NODES)


def is_literal(node: Node) -> bool:
    return isinstance(node, Const) and node.literal


def render(node: Node) -> str:
    if isinstance(node, Const):
        v = node.value
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return "TRUE" if v else "FALSE"
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        return repr(v)
    if isinstance(node, PropertyRef):
        return node.name
    if isinstance(node, Negate):
        return "-" + render(node.operand)
    return "a condition"


class Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    # ------------------------------------------------------------------------------------------ token helpers

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def peek(self, ahead: int = 1) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def at(self, kind: TokenKind, text: str | None = None) -> bool:
        t = self.tok
        return t.kind is kind and (text is None or t.text == text)

    def advance(self) -> Token:
        t = self.tok
        if t.kind is not TokenKind.EOF:
            self.i += 1
        return t

    def fail(self, expected: str, tok: Token | None = None) -> SqlParseError:
        t = tok or self.tok
        return SqlParseError(self.text, t.pos + 1, expected, t.describe())

    def fail_at(self, node: Node, expected: str, found: str) -> SqlParseError:
        return SqlParseError(self.text, node.pos + 1, expected, found)

    def expect(self, kind: TokenKind, text: str, expected: str) -> Token:
        if not self.at(kind, text):
            raise self.fail(expected)
        return self.advance()

    # ------------------------------------------------------------------------------------------ grammar

    def parse(self) -> Node:
        node = self.or_expr()
        if not self.at(TokenKind.EOF):
            raise self.fail("AND, OR, a comparison operator or the end of the expression")
        root = self.as_boolean(node)
        self.check_depth(root)
        return root

    def check_depth(self, root: Node) -> None:
        """SqlParseError at the first operator nested more than MAX_DEPTH deep (walked without recursion)."""
        stack = [(root, 1)]
        while stack:
            node, depth = stack.pop()
            children = _children(node)
            if not children:
                continue
            if depth > MAX_DEPTH:
                raise self.fail_at(
                    node,
                    f"an expression at most {MAX_DEPTH} operators deep (each = <> IS NULL in a chain nests one "
                    "level; split the chain or use IN)",
                    "an operator nested deeper",
                )
            stack.extend((child, depth + 1) for child in children)

    def as_boolean(self, node: Node) -> Node:
        if is_boolean(node):
            return node
        if isinstance(node, PropertyRef):
            return BoolCast(node.pos, node)
        raise self.fail_at(node, "a condition (a comparison, IN, BETWEEN, IS NULL, TRUE...)", render(node))

    def or_expr(self) -> Node:
        operands = self.chain("OR", self.and_expr)
        return operands[0] if len(operands) == 1 else Or(operands[0].pos, tuple(operands))

    def and_expr(self) -> Node:
        operands = self.chain("AND", self.equality)
        return operands[0] if len(operands) == 1 else And(operands[0].pos, tuple(operands))

    def chain(self, keyword: str, operand: Callable[[], Node]) -> list[Node]:
        """The operands of ``x keyword y keyword z ...``, each checked to be a condition once its right neighbour
        is parsed (the order a left-nested tree reported errors in); a single operand is returned unchecked."""
        operands = [operand()]
        while self.at(TokenKind.KEYWORD, keyword):
            self.advance()
            right = operand()
            if len(operands) == 1:
                operands[0] = self.as_boolean(operands[0])
            operands.append(self.as_boolean(right))
        return operands

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            if self.at(TokenKind.OP, "=") or self.at(TokenKind.OP, "<>"):
                negated = self.advance().text == "<>"
                right = self.comparison()
                node: Node = self.make_equal(left, right)
                left = Not(left.pos, node) if negated else node
            elif self.at(TokenKind.KEYWORD, "IS"):
                self.advance()
                negated = self.at(TokenKind.KEYWORD, "NOT")
                if negated:
                    self.advance()
                self.expect(TokenKind.KEYWORD, "NULL", "NULL after IS" + (" NOT" if negated else "") + "")
                node = Equal(left.pos, left, Const(left.pos, None))
                left = Not(left.pos, node) if negated else node
            else:
                return left

    def comparison(self) -> Node:
        left = self.unary()
        while True:
            t = self.tok
            if t.kind is TokenKind.OP and t.text in COMPARE_OPS:
                self.advance()
                right = self.unary()
                left = self.make_compare(t.text, left, right)
            elif t.kind is TokenKind.KEYWORD and t.text == "BETWEEN":
                self.advance()
                left = self.between(left, negated=False)
            elif t.kind is TokenKind.KEYWORD and t.text == "IN":
                self.advance()
                left = self.in_list(left, negated=False)
            elif t.kind is TokenKind.KEYWORD and t.text == "NOT" and self.peek().text in ("BETWEEN", "IN"):
                self.advance()
                word = self.advance().text
                left = self.between(left, negated=True) if word == "BETWEEN" else self.in_list(left, negated=True)
            else:
                return left

    def between(self, value: Node, negated: bool) -> Node:
        low = self.unary()
        self.expect(TokenKind.KEYWORD, "AND", "AND between the two bounds of BETWEEN")
        high = self.unary()
        if not negated and is_literal(low) and is_literal(high):
            lo, hi = low, high
            assert isinstance(lo, Const) and isinstance(hi, Const)
            if lo.value is None or hi.value is None:
                raise self.fail_at(low, "BETWEEN bounds that are not NULL", "NULL")
            if _literal_less(hi.value, lo.value):
                raise self.fail_at(
                    low, f"a lower bound <= the upper bound {render(hi)}", f"{render(lo)} (swap the bounds)"
                )
        if negated:
            return Or(value.pos, (self.make_compare("<", value, low), self.make_compare(">", value, high)))
        return And(value.pos, (self.make_compare(">=", value, low), self.make_compare("<=", value, high)))

    def in_list(self, left: Node, negated: bool) -> Node:
        if not isinstance(left, PropertyRef):
            raise self.fail_at(left, "a property name on the left of IN", render(left))
        self.expect(TokenKind.OP, "(", "'(' opening the IN list")
        values: list[str] = []
        while True:
            if not self.at(TokenKind.STRING):
                raise self.fail("a string literal in the IN list ('a', 'b', ...)")
            values.append(self.advance().text)
            if self.at(TokenKind.OP, ","):
                self.advance()
                continue
            self.expect(TokenKind.OP, ")", "',' or ')' in the IN list")
            return In(left.pos, left, frozenset(values), negated)

    def unary(self) -> Node:
        t = self.tok
        if (t.kind is TokenKind.OP and t.text in ("+", "-")) or (t.kind is TokenKind.KEYWORD and t.text == "NOT"):
            self.advance()
            self.enter(t)
            operand = self.unary()
            self.depth -= 1
            if t.text == "+":
                return operand
            if t.text == "-":
                return _negate(t.pos, operand)
            return Not(t.pos, self.as_boolean(operand))
        return self.primary()

    def primary(self) -> Node:
        t = self.advance()
        if t.kind is TokenKind.STRING:
            return Const(t.pos, t.text)
        if t.kind is TokenKind.INTEGER:
            return Const(t.pos, self.integer(t))
        if t.kind is TokenKind.DECIMAL:
            return Const(t.pos, float(t.text))
        if t.kind is TokenKind.KEYWORD and t.text in ("TRUE", "FALSE", "NULL"):
            return Const(t.pos, None if t.text == "NULL" else t.text == "TRUE")
        if t.kind is TokenKind.IDENT:
            return PropertyRef(t.pos, t.text)
        if t.kind is TokenKind.OP and t.text == "(":
            self.enter(t)
            inner = self.or_expr()
            self.depth -= 1
            self.expect(TokenKind.OP, ")", "')' closing the parenthesis opened at column " + str(t.pos + 1))
            return inner
        raise self.fail("a property name, a literal (string, number, TRUE, FALSE, NULL) or '('", t)

    def integer(self, t: Token) -> int:
        digits = t.text.rstrip("lL")  # the lexer allows no leading zeros: the digit count is the magnitude
        if len(digits) > MAX_LONG_DIGITS or int(digits) > LONG_MAX:
            raise self.fail(f"an integer of at most {LONG_MAX}", t)
        value = int(digits)
        return value if value <= INT_MAX else JLong(value)

    def enter(self, t: Token) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(f"at most {MAX_NESTING} nested parentheses / NOT / '-'", t)

    # ------------------------------------------------------------------------------------------ checks

    def make_compare(self, op: str, left: Node, right: Node) -> Node:
        for side in (left, right):
            if is_literal(side):
                assert isinstance(side, Const)
                if side.value is None or isinstance(side.value, bool | str):
                    raise self.fail_at(side, f"a number or a property for {op!r}", render(side))
            elif is_boolean(side):
                raise self.fail_at(side, f"a number or a property for {op!r}", "a condition")
        return Compare(left.pos, op, left, right)

    def make_equal(self, left: Node, right: Node) -> Node:
        for side in (left, right):
            if is_literal(side) and isinstance(side, Const) and side.value is None:
                raise self.fail_at(side, "a value to compare with (use IS NULL / IS NOT NULL for NULL)", "NULL")
        if is_literal(left) and is_literal(right) and is_boolean(left) and not is_boolean(right):
            raise self.fail_at(right, f"a boolean to compare with {render(left)}", render(right))
        return Equal(left.pos, left, right)


def _children(node: Node) -> tuple[Node, ...]:
    """The operand nodes of an operator node (none for a literal or a property)."""
    if isinstance(node, And | Or):
        return node.operands
    if isinstance(node, Equal | Compare):
        return (node.left, node.right)
    if isinstance(node, Not | Negate):
        return (node.operand,)
    if isinstance(node, BoolCast):
        return (node.prop,)
    return ()


def _negate(pos: int, operand: Node) -> Node:
    """Fold '-' over a number literal (marked non-literal, as RocketMQ sees a negation); keep it otherwise."""
    if isinstance(operand, Const) and isinstance(operand.value, int | float) and not isinstance(operand.value, bool):
        v = operand.value
        if isinstance(v, JLong):
            return Const(pos, JLong(-v), literal=False)
        if isinstance(v, int):
            return Const(pos, -v if v != INT_MIN else v, literal=False)  # Java int negation wraps at MIN
        return Const(pos, -v, literal=False)
    return Negate(pos, operand)


def _literal_less(a: Value, b: Value) -> bool:
    """Whether literal a < literal b for the BETWEEN bound check (numbers across types, else same type only)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a < b  # type: ignore[operator]
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a < b
    if isinstance(a, str) and isinstance(b, str):
        return a < b
    return False


def parse(text: str) -> Node:
    """The tree of a selector; SqlParseError (a SubscriptionParseError) with column and expectation if bad."""
    return Parser(text).parse()

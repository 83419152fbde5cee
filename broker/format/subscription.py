"""Tag expressions, as RocketMQ's ``SubscriptionData``: ``*`` (or empty) for every message, else tags joined by
``||``. The broker filters on the consume queue's tag hash codes (cheap, may collide); the client re-checks the
tag string exactly.
"""

from __future__ import annotations

from broker.errors import SubscriptionParseError
from broker.format.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, tag_hash_code

SUB_ALL = "*"
MAX_EXPRESSION_CHARS = 4096


def parse_tags(expression: str | None) -> frozenset[str] | None:
    """The set of tags an expression accepts; None means every message (``*``)."""
    expr = (expression or "").strip()
    if not expr or expr == SUB_ALL:
        return None
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise SubscriptionParseError(f"tag expression is {len(expr)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    tags = []
    for position, part in enumerate(expr.split("||")):
        tag = part.strip()
        if not tag:
            raise SubscriptionParseError(
                f"tag expression {expr!r} has an empty tag at term {position + 1}; write 'TagA || TagB' or '*'"
            )
        if tag == SUB_ALL or NAME_VALUE_SEPARATOR in tag or PROPERTY_SEPARATOR in tag:
            raise SubscriptionParseError(f"tag {tag!r} in {expr!r} is not a plain tag; use '*' alone for every message")
        tags.append(tag)
    return frozenset(tags)


def tag_codes(tags: frozenset[str] | None) -> set[int] | None:
    """The consume-queue hash codes matching ``tags`` (None: no filter)."""
    return None if tags is None else {tag_hash_code(t) for t in tags}


def tag_matches(tags: frozenset[str] | None, message_tag: str | None) -> bool:
    """The client's exact check after the broker's hash filter."""
    return tags is None or (message_tag is not None and message_tag in tags)

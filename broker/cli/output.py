"""What the commands print: aligned tables on stdout, or JSON with ``--json``; messages as one line or one object."""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from broker.client.outgoing_message import user_properties

BODY_PREVIEW_CHARS = 80  # a message line shows at most this much of the body


def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit(args: argparse.Namespace, data: Any, rows: Sequence[Sequence[object]], headers: Sequence[str]) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(table(rows, headers))


def vars_of(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def number(value: float) -> str:
    """A statistic for a table: counts as integers (never 1.23e+06), other values with three decimals."""
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def message_dict(m: Any, broker_name: str = "") -> dict[str, Any]:
    try:
        body: dict[str, str] = {"body": m.body.decode("utf-8")}
    except UnicodeDecodeError:
        body = {"body": base64.b64encode(m.body).decode(), "body_encoding": "base64"}
    return {
        "msg_id": m.msg_id, "topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
        "commitlog_offset": m.commitlog_offset, "tags": m.tags, "keys": m.keys, "properties": m.properties,
        "born_timestamp": m.born_timestamp, "store_timestamp": m.store_timestamp,
        "reconsume_times": m.reconsume_times, **({"broker_name": broker_name} if broker_name else {}), **body,
    }


def properties_text(properties: Mapping[str, str]) -> str:
    """The application's properties as ``{name=value, ...}`` (the broker's own, such as UNIQ_KEY, left out)."""
    own = user_properties(properties)
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(own.items())) + "}" if own else "-"


def message_line(m: Any, broker_name: str = "") -> str:
    """``[broker/]queue:offset  id  tags  keys  props  body`` (the broker only in a cluster)."""
    where = f"{broker_name}/" if broker_name else ""
    body = m.body.decode("utf-8", "replace")
    if len(body) > BODY_PREVIEW_CHARS:
        body = body[: BODY_PREVIEW_CHARS - 3] + "..."
    return (
        f"{where}{m.queue_id}:{m.queue_offset}  {m.msg_id}  tags={m.tags or '-'}  keys={','.join(m.keys) or '-'}  "
        f"props={properties_text(m.properties)}  {body!r}"
    )

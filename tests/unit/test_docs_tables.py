"""The user documentation's reference tables against the code they describe, so neither can drift alone.

docs/connector.md: every source and sink option (names both ways, and every default written as a JSON value), the
read schema's columns in order, the sink's columns. docs/operations.md: every broker and store setting with its
default, the store settings the broker owns, and every metric series a running broker serves.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from broker.config import BROKER_OWNED_STORE_SETTINGS, BrokerConfig
from broker.errors import InvalidArgumentError
from broker.store.store_config import StoreConfig
from connector.arrow_encoder import KNOWN_COLUMNS
from connector.options import KNOWN_OPTIONS, parse_options
from connector.schema import COLUMNS
from connector.sink_options import KNOWN as KNOWN_SINK_OPTIONS
from connector.sink_options import parse_sink_options

DOCS = Path(__file__).resolve().parents[2] / "docs"
CODE_SPAN = re.compile(r"`([^`]+)`")
NOT_JSON = object()


def section(path: Path, heading: str) -> str:
    """The text under a markdown heading (any level), up to the next heading of the same or a higher level."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        level = len(line) - len(line.lstrip("#"))
        if level and line[level:].strip() == heading:
            end = next(
                (j for j in range(i + 1, len(lines)) if 0 < len(lines[j]) - len(lines[j].lstrip("#")) <= level),
                len(lines),
            )
            return "\n".join(lines[i + 1 : end])
    raise AssertionError(f"{path.name} has no heading {heading!r}")


def first_table(text: str) -> list[list[str]]:
    """The cells of the first markdown table in ``text``, header and separator left out."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start:end]
    assert len(rows) >= 3, f"no table in:\n{text[:400]}"
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    return cells[2:]


def name_of(cell: str) -> str:
    """`name` (or `name{labels}`) -> name."""
    spans = CODE_SPAN.findall(cell)
    assert spans, f"no `name` in table cell {cell!r}"
    return spans[0].split("{")[0]


def json_default(cell: str) -> Any:
    """A default cell's first code span read as JSON; NOT_JSON when it is none (a word, a duration, "required")."""
    spans = CODE_SPAN.findall(cell)
    if not spans:
        return NOT_JSON
    try:
        return json.loads(spans[0])
    except ValueError:
        return NOT_JSON


def camel_to_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# ------------------------------------------------------------------------------------------------ connector.md


def test_every_source_option_is_documented_and_nothing_else() -> None:
    rows = first_table(section(DOCS / "connector.md", "Source options"))
    documented = [name_of(r[0]) for r in rows]
    assert len(documented) == len(set(documented)), documented
    assert sorted(documented) == sorted(KNOWN_OPTIONS.values())
    assert all(len(r) == 4 and r[2] for r in rows), "each row: option, default, meaning, Kafka option"


def defaults_compared(rows: list[list[str]], parsed: object) -> int:
    """Assert that each option of ``rows`` whose documented default is JSON has that default in ``parsed`` (the
    options as the code parses them, every one left out); how many were compared."""
    compared = 0
    for row in rows:
        field = camel_to_snake(name_of(row[0]))
        default = json_default(row[1])
        if default is NOT_JSON or not hasattr(parsed, field):
            continue
        assert getattr(parsed, field) == default, f"{name_of(row[0])}: documented {row[1]}"
        compared += 1
    return compared


def test_documented_source_defaults_are_the_code_defaults() -> None:
    parsed = parse_options({"endpoints": "127.0.0.1:10911", "topic": "t"}, streaming=True)
    compared = defaults_compared(first_table(section(DOCS / "connector.md", "Source options")), parsed)
    assert compared >= 5, compared


def test_every_sink_option_is_documented_with_its_default() -> None:
    rows = first_table(section(DOCS / "connector.md", "Sink options"))
    documented = [name_of(r[0]) for r in rows]
    assert sorted(documented) == sorted(KNOWN_SINK_OPTIONS.values())
    parsed = parse_sink_options({"endpoints": "127.0.0.1:10911"})
    compared = defaults_compared(rows, parsed)
    assert compared >= 6, compared
    assert parsed.exactly_once and "`exactly-once`" in rows[documented.index("deliveryGuarantee")][1]


def test_the_read_schema_and_the_sink_columns_are_the_code_s() -> None:
    read = [name_of(r[0]) for r in first_table(section(DOCS / "connector.md", "The rows a read produces"))]
    assert read == list(COLUMNS)
    sink = [name_of(r[0]) for r in first_table(section(DOCS / "connector.md", "The columns the sink takes"))]
    assert sorted(sink) == sorted(KNOWN_COLUMNS)


# ------------------------------------------------------------------------------------------------ operations.md


def settings_table(heading: str) -> dict[str, list[str]]:
    text = section(DOCS / "operations.md", "Configuration reference")
    rows = first_table(text[text.index(f"### {heading}") :])
    out = {name_of(r[0]): r for r in rows}
    assert len(out) == len(rows), "a setting documented twice"
    assert all(len(r) == 4 and r[3] for r in rows), "each row: setting, default, unit, meaning"
    return out


def test_every_broker_setting_is_documented_with_its_default() -> None:
    rows = settings_table("Broker settings")
    fields = {f.name: f for f in dataclasses.fields(BrokerConfig) if f.name != "store"}
    assert sorted(rows) == sorted(fields)
    defaults = BrokerConfig()  # validated defaults: what a broker without a config file runs with
    for name, row in rows.items():
        assert json_default(row[1]) == getattr(defaults, name), f"{name}: documented {row[1]}"


def test_every_store_setting_is_documented_with_its_default() -> None:
    rows = settings_table("Store settings")
    settable = {f.name for f in dataclasses.fields(StoreConfig)} - BROKER_OWNED_STORE_SETTINGS.keys()
    assert sorted(rows) == sorted(settable)
    defaults = StoreConfig(store_path="unused")
    for name, row in rows.items():
        assert json_default(row[1]) == getattr(defaults, name), f"{name}: documented {row[1]}"
    text = section(DOCS / "operations.md", "Store settings")
    missing = [name for name in BROKER_OWNED_STORE_SETTINGS if f"`{name}`" not in text]
    assert missing == [], f"the store settings the broker owns are not all named: {missing}"


def test_the_configuration_example_loads(tmp_path: Path) -> None:
    text = section(DOCS / "operations.md", "Configuration reference")
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "broker.toml").write_text(example)
    config = BrokerConfig.from_file(tmp_path / "broker.toml")
    assert config.flush_disk_type == "SYNC_FLUSH" and config.store_config().file_reserved_time_hours == 24


def test_an_unknown_setting_points_to_the_documentation_not_the_source() -> None:
    for data in ({"store": {"mapped_file_size_commitlog": 1}}, {"listen_address": "127.0.0.1:1"}):
        with pytest.raises(InvalidArgumentError) as caught:
            BrokerConfig.from_dict(data)
        assert "docs/operations.md" in caught.value.message and ".py" not in caught.value.message


def test_every_metric_series_is_documented_with_its_type(broker_factory: Any) -> None:
    """The series a running broker serves (counters and histograms, and the gauges it registers at start)."""
    rendered = broker_factory().metrics.render()
    served = dict(re.findall(r"^# TYPE (\S+) (\S+)$", rendered, re.MULTILINE))
    rows = first_table(section(DOCS / "operations.md", "Metrics"))
    documented = {name_of(r[0]): r[1] for r in rows}
    assert documented == served


# ------------------------------------------------------------------------------------------------ links

LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_links_between_the_readme_and_the_docs_resolve() -> None:
    pages = [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor:
                headings = [line.lstrip("#") for line in linked.read_text(encoding="utf-8").splitlines()
                            if line.startswith("#")]
                if anchor not in {github_anchor(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []

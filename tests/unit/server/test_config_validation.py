"""BrokerConfig refuses, when it is loaded, every value that would break the broker later: a 0 interval that spins
a CPU, a size that makes every pull fail, a store-table entry that silently overrides the broker's own setting,
a value that only fails inside start() after the store and server are up. Each message names the setting, the
value and what is allowed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig, check_setting_types
from broker.errors import InvalidArgumentError
from broker.format.system_topics import SCHEDULE_TOPIC
from broker.store import StoreConfig

SMALL_STORE = {"mapped_file_size_commit_log": 1 << 20, "max_message_size": 64 * 1024}


def refused(settings: dict[str, Any]) -> str:
    with pytest.raises(InvalidArgumentError) as e:
        BrokerConfig.from_dict(settings)
    return e.value.message


@pytest.mark.parametrize(
    ("settings", "name", "value"),
    [
        ({"consumer_offset_persist_interval_ms": 0}, "consumer_offset_persist_interval_ms", "0"),
        ({"consumer_offset_persist_interval_ms": -1}, "consumer_offset_persist_interval_ms", "-1"),
        ({"store": {"flush_interval_commit_log_ms": 0}}, "flush_interval_commit_log_ms", "0"),
        ({"store": {"flush_interval_consume_queue_ms": 0}}, "flush_interval_consume_queue_ms", "0"),
        ({"store": {"dispatch_interval_ms": 0}}, "dispatch_interval_ms", "0"),
        ({"store": {"dispatch_interval_ms": -3}}, "dispatch_interval_ms", "-3"),
    ],
)
def test_loop_intervals_must_be_positive(settings: dict[str, Any], name: str, value: str) -> None:
    """A 0 or negative wait between passes of a service loop turned it into a busy loop at 100% of a CPU."""
    message = refused(settings)
    assert f"{name} is {value}" in message and "positive" in message, message


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"max_pull_bytes": -1}, "max_pull_bytes is -1; it must be a positive integer"),
        ({"max_pull_bytes": 0}, "max_pull_bytes is 0"),
        ({"default_pull_max_msgs": -5}, "default_pull_max_msgs is -5"),
        ({"consumer_expire_ms": -1}, "consumer_expire_ms is -1"),
        ({"store": {"max_message_size": 0}}, "max_message_size is 0"),
        ({"store": {"max_batch_bytes": 0}}, "max_batch_bytes is 0"),
        ({"store": {"recover_normally_file_count": 0}}, "recover_normally_file_count is 0"),
        ({"store": {"recover_normally_file_count": -1}}, "recover_normally_file_count is -1"),
        ({"store": {"file_reserved_time_hours": -1}}, "file_reserved_time_hours is -1; it must be a number of hours"),
        ({"store": {"file_reserved_time_hours": math.nan}}, "file_reserved_time_hours is nan"),
        ({"shutdown_grace_s": -1.0}, "shutdown_grace_s is -1.0; it must be a finite number of seconds >= 0"),
        ({"shutdown_grace_s": math.nan}, "shutdown_grace_s is nan"),
        ({"shutdown_grace_s": math.inf}, "shutdown_grace_s is inf"),
        ({"metrics_port": 70000}, "metrics_port is 70000; it must be a port in 0..65535"),
        ({"metrics_port": -1}, "metrics_port is -1"),
        ({"store": {"max_index_num": 2}}, "max_index_num >= 3"),  # 2 indexed no key at all
        # RocketMQ separates hours with ';': these were accepted and meant "never" (expiry only past 75% disk)
        (
            {"store": {"delete_when": "04,16"}},
            "delete_when='04,16': give hours of the day 0..23 separated by semicolons",
        ),
        ({"store": {"delete_when": "4:00"}}, "delete_when='4:00'"),
        ({"store": {"delete_when": "25"}}, "delete_when='25'"),
        ({"store": {"delete_when": "4;"}}, "delete_when='4;'"),
    ],
)
def test_sizes_counts_and_ranges_are_checked(settings: dict[str, Any], needle: str) -> None:
    message = refused(settings)
    assert needle in message, message


def test_edge_values_that_work_are_still_accepted() -> None:
    for settings in (
        {"store": {"file_reserved_time_hours": 0}},  # RocketMQ: every file not being written is expired
        {"shutdown_grace_s": 0},
        {"metrics_port": 0},  # any free port
        {"metrics_port": 65535},
        {"metrics_port": None},
        {"store": {"recover_normally_file_count": 1, "dispatch_interval_ms": 1}},
        {"store": {"delete_when": "04;16", "max_index_num": 3}},
        {"store": {"delete_when": "0; 23"}},
        {"store": {"delete_when": ""}},  # no hour: expired files go by disk usage only
    ):
        BrokerConfig.from_dict(settings)


@pytest.mark.parametrize(
    ("key", "value", "instead"),
    [
        ("flush_disk_type", "ASYNC_FLUSH", "top-level flush_disk_type (or --flush)"),
        ("store_path", "/elsewhere", "top-level store_path (or --store)"),
        ("store_host", ["10.0.0.1", 10911], "top-level listen (or --listen)"),
        ("schedule_topic", "MY_TOPIC", SCHEDULE_TOPIC),
        ("delay_level_ms", [1000, 2000], "top-level message_delay_level"),
    ],
)
def test_store_table_cannot_override_the_brokers_own_settings(key: str, value: object, instead: str) -> None:
    """They were applied after the broker's values: `--flush sync` ran ASYNC while the start line said SYNC."""
    message = refused({"store": {key: value}, "flush_disk_type": "sync"})
    assert f"the store table sets {key!r}" in message and instead in message, message
    with pytest.raises(InvalidArgumentError, match=f"sets {key!r}"):  # also when built in code, not from a file
        BrokerConfig(store={key: value})


def test_store_config_is_the_brokers_settings_plus_the_store_table(tmp_path: Path) -> None:
    config = BrokerConfig.from_dict(
        {"store": {**SMALL_STORE, "flush_interval_commit_log_ms": 7}, "message_delay_level": "1s 2m"},
        store_path=str(tmp_path / "s"), flush_disk_type="sync",
    )
    store = config.store_config(store_host=("10.1.2.3", 4567))
    assert isinstance(store, StoreConfig)
    assert store.flush_disk_type == "SYNC_FLUSH" and store.store_path == str(tmp_path / "s")
    assert store.store_host == ("10.1.2.3", 4567) and store.schedule_topic == SCHEDULE_TOPIC
    assert store.delay_level_ms == (1000, 120_000)
    assert store.flush_interval_commit_log_ms == 7 and store.max_message_size == 64 * 1024


def test_delay_levels_and_transaction_settings_fail_at_load_not_in_start() -> None:
    """They passed validation and failed only inside start(), after the store and the server had started."""
    assert "message_delay_level: delay level 'abc'" in refused({"message_delay_level": "abc"})
    for name in ("transaction_check_interval_ms", "transaction_timeout_ms", "transaction_check_max"):
        message = refused({name: 0})
        assert f"{name} is 0; it must be a positive integer" in message, message


@pytest.mark.parametrize("limit", [0, 1_000_000])
def test_grpc_max_message_bytes_must_hold_a_full_pull_and_the_largest_message(limit: int) -> None:
    """With 1,000,000 a pull of two 600 KB messages failed with RESOURCE_EXHAUSTED on every try; 0 failed all."""
    message = refused({"grpc_max_message_bytes": limit})
    assert f"grpc_max_message_bytes is {limit}" in message, message
    assert "max_pull_bytes=16777216" in message and "store.max_message_size=4194304" in message, message
    assert f"at least {16 * 1024 * 1024 + (1 << 20)}" in message, message


def test_grpc_max_message_bytes_follows_the_larger_of_pull_and_message_size() -> None:
    small = {"max_pull_bytes": 1 << 20, "store": {"max_message_size": 3 << 20, "max_batch_bytes": 1 << 20}}
    BrokerConfig.from_dict({**small, "grpc_max_message_bytes": (3 << 20) + (1 << 20)})
    message = refused({**small, "grpc_max_message_bytes": 3 << 20})
    assert "store.max_message_size=3145728" in message and f"at least {4 << 20}" in message, message
    BrokerConfig.from_dict({})  # the defaults fit: 128 MiB for 16 MiB pulls


@pytest.mark.parametrize(
    ("value", "ok"),
    [(["a", 1], True), (("a", 1), True), (["a", "b"], False), (["a"], False), (["a", 1, 2], False), ([1, 1], False)],
)
def test_fixed_length_tuple_settings_are_checked_position_by_position(value: list[object], ok: bool) -> None:
    """store_host ["a", "b"] passed the type check (only the first item type was looked at) and broke start()."""
    if ok:
        check_setting_types(StoreConfig, {"store_host": value}, "f.json [store]")
    else:
        with pytest.raises(InvalidArgumentError, match=r"'store_host' is .*it must be tuple\[str, int\]"):
            check_setting_types(StoreConfig, {"store_host": value}, "f.json [store]")
    check_setting_types(StoreConfig, {"delay_level_ms": [1, 2, 3]}, "s")  # tuple[int, ...]: any length
    with pytest.raises(InvalidArgumentError, match="delay_level_ms"):
        check_setting_types(StoreConfig, {"delay_level_ms": [1, "2"]}, "s")


def test_config_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"listen": "127.0.0.1:0", "store_path": "caf\xe9"}')
    with pytest.raises(InvalidArgumentError, match=r"latin1\.json is not UTF-8 text \(byte 44 is b'\\xe9'\)"):
        BrokerConfig.from_file(bad)


def test_config_file_error_names_the_format_it_was_read_as(tmp_path: Path) -> None:
    """A .yaml file is read as JSON: the message said "not valid yaml", as if YAML were supported."""
    yaml = tmp_path / "cfg.yaml"
    yaml.write_text('listen = "127.0.0.1:0"\n')
    with pytest.raises(InvalidArgumentError) as e:
        BrokerConfig.from_file(yaml)
    assert "is not valid JSON (only .toml files are read as TOML, others as JSON)" in e.value.message
    assert "yaml:" not in e.value.message
    toml = tmp_path / "cfg.toml"
    toml.write_text("listen = \n")
    with pytest.raises(InvalidArgumentError, match=r"cfg\.toml is not valid TOML: "):
        BrokerConfig.from_file(toml)
    js = tmp_path / "cfg.json"
    js.write_text(json.dumps({"listen": "127.0.0.1:0"})[:-1])
    with pytest.raises(InvalidArgumentError, match=r"cfg\.json is not valid JSON: "):
        BrokerConfig.from_file(js)


def test_unknown_settings_point_to_the_configuration_reference_not_a_source_file() -> None:
    """An unknown store setting said `see broker/store/config.py`: a user reads the docs, not the source."""
    for data, needle in (({"store": {"mapped_file_size": 1}}, "unknown store setting(s) ['mapped_file_size']"),
                         ({"flush": "sync"}, "unknown setting(s) ['flush']")):
        with pytest.raises(InvalidArgumentError) as e:
            BrokerConfig.from_dict(data)
        assert needle in e.value.message and "docs/operations.md" in e.value.message, e.value.message
        assert ".py" not in e.value.message, e.value.message
    with pytest.raises(InvalidArgumentError, match="mapped_file_size_commit_log"):  # and the names it knows
        BrokerConfig.from_dict({"store": {"mapped_file_size": 1}})

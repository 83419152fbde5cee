"""The streaming jobs' command lines: bad arguments stop the job before any SparkSession starts."""

from __future__ import annotations

import pytest

from streaming_jobs import to_parquet, topic_mirror, windowed_counts

MIRROR = ["--checkpoint", "/tmp/never-used", "--source", "A", "--target", "B"]
PARQUET = ["--checkpoint", "/tmp/never-used", "--topic", "A", "--output", "/tmp/never-used-out"]


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_max_messages_per_trigger_below_one_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """0 must not pass as 'no limit' (a truthiness test would drop it, and the job would run unlimited)."""
    jobs = ((to_parquet, PARQUET), (topic_mirror, MIRROR), (windowed_counts, MIRROR))
    for job, argv in jobs:
        with pytest.raises(SystemExit) as exit_info:
            job.build_parser().parse_args([*argv, "--max-messages-per-trigger", value])
        assert exit_info.value.code == 2
        assert "--max-messages-per-trigger" in capsys.readouterr().err
    args = topic_mirror.build_parser().parse_args([*MIRROR, "--max-messages-per-trigger", "1"])
    assert args.max_messages_per_trigger == 1


def test_a_job_writing_into_its_own_source_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--source X --target X read its own output back and copied (or counted) it again without end."""
    for job in (topic_mirror, windowed_counts):
        with pytest.raises(SystemExit) as exit_info:
            job.main(["--checkpoint", "/tmp/never-used", "--source", "A", "--target", "A"])
        assert exit_info.value.code == 2
        assert "--source and --target are both 'A'" in capsys.readouterr().err


def test_help_keeps_each_jobs_example_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """--help re-wrapped the job's example command into one paragraph of prose."""
    for job in (to_parquet, topic_mirror, windowed_counts):
        with pytest.raises(SystemExit):
            job.build_parser().parse_args(["--help"])
        shown = capsys.readouterr().out
        assert shown.startswith(f"usage: python -m streaming_jobs.{job.__name__.rsplit('.', 1)[1]} ")
        example = [line for line in (job.__doc__ or "").splitlines() if line.startswith("    ")]
        assert example and all(line in shown.splitlines() for line in example), (job.__name__, shown)
        assert "(default: continuous)" in shown  # and every option's default is still shown


def test_namesrv_names_the_cluster_instead_of_endpoints() -> None:
    """--namesrv gives the connector the name servers (it then follows a replicated group's master); without it the
    job reads and writes at --endpoints."""
    from streaming_jobs.common import brokers

    with_namesrv = topic_mirror.build_parser().parse_args([*MIRROR, "--namesrv", "10.0.0.1:9876,10.0.0.2:9876"])
    assert brokers(with_namesrv) == {"namesrv": "10.0.0.1:9876,10.0.0.2:9876"}
    plain = topic_mirror.build_parser().parse_args([*MIRROR, "--endpoints", "10.0.0.3:10911"])
    assert brokers(plain) == {"endpoints": "10.0.0.3:10911"}

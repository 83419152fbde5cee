"""The repository speaks to its users: no tracked text tells the story of how it was developed.

Dated measurements and the reasons for a design are welcome; numbered work periods (an ordinal before the word
for a period of work, or "the eleventh's"), what an issue asked for, and who tried what are not: a reader cannot
act on them, and they go stale. The patterns below are the kinds of prose found; this file is left out of the
scan (it has to name them).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
THIS_FILE = Path(__file__).resolve().relative_to(REPO).as_posix()
MAX_FILE_BYTES = 4 << 20  # larger tracked files are data (results, images), not prose

PERIOD = "session"  # the word for a period of work; written once, so this file's own text names no numbered one
ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth"
    r"|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(?:st|nd|rd|th))"
)
HISTORY = re.compile(
    "|".join(
        (
            rf"\b{ORDINAL}[- ]{PERIOD}s?\b",  # an ordinal before the word, spaced or hyphenated
            rf"\bthe {ORDINAL}'s\b",  # "on the eleventh's day", "the sixth's figures"
            r"\bsessions? (?:no\.? ?)?\d+\b",  # "session 6"
            r"\b(?:measured|run|tried|found|seen)\s+(?:during|in)\s+(?:the|this|that|an?)\s+(?:[\w-]+\s+){0,3}session\b",
            r"\b(?:this|that|the previous|the last|the next|an earlier|a later) (?:work )?session's\b",
            r"(?<!rocketmq )(?<!rocketmq/)\bissue \d+\b",  # the project's own issues (RocketMQ's are references)
            r"\bthe issue(?:'s| (?:asked|expected|wanted|said|says|requires|required))\b",
            r"\bhelper's\b",  # "a helper's check"
            r"\btried and (?:dropped|rejected|abandoned)\b",
        )
    ),
    re.IGNORECASE,
)


def tracked_text_files() -> list[Path]:
    """Every file git tracks (or would: new files not ignored) that reads as UTF-8 text."""
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(command, cwd=REPO, capture_output=True, check=True, timeout=60).stdout.split(b"\0")
    out = []
    for raw in listed:
        name = raw.decode()
        path = REPO / name
        if not name or name == THIS_FILE or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append(path)
    return out


def history_prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line that tells development history."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def test_the_patterns_find_development_history() -> None:
    """The search finds each kind of prose it is for, and leaves ordinary words alone."""
    found = [
        f"Measured 2026-11-24 (sixth {PERIOD}) with `python -m bench.store`",
        f"the sixth-{PERIOD} tables are kept for comparison",
        f"against 169k on the sixth {PERIOD}'s day",
        "(`sync_ceiling.json` the eleventh's)",
        "which is what session 6 measured",
        "figures measured during the quiet evening session",
        "Column order and types are part of the contract (issue 5)",
        "at the issue's fixed 5k msgs/s",
        "README corrected against the code (a helper's check)",
        "Tried and dropped: a zero-filled commit-log file",
    ]
    kept = [
        "register(spark) makes format('sluice') known to this session",
        "spark_session('sluice-integration', shuffle_partitions=2)",
        "@pytest.fixture(scope='session')",
        "Tolerates an empty last file (apache/rocketmq issue 9728)",
        "the next pull is issued on a helper thread",
        "one SparkSession for the module",
        "Measured 2026-11-25: 600k msgs/s",
    ]
    assert [line for line in found if not HISTORY.search(line)] == []
    assert [line for line in kept if HISTORY.search(line)] == []


def test_no_tracked_text_tells_development_history() -> None:
    files = tracked_text_files()
    assert len(files) > 100, f"only {len(files)} tracked text files found under {REPO}"
    hits = [
        f"{path.relative_to(REPO)}:{n}: {line[:160]}"
        for path in files
        for n, line in history_prose(path.read_text(encoding="utf-8"))
    ]
    assert hits == [], "development history in the repository's text:\n" + "\n".join(hits)

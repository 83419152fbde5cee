"""Where a command's connection settings come from: its options, the environment, a profile file, in that order.

A profile (``--profile FILE``, else ``$SLUICE_PROFILE``) is a small file of ``KEY=VALUE`` lines naming the same
variables a shell would export: ``SLUICE_ENDPOINT``, ``SLUICE_NAMESRV``, ``SLUICE_ACCESS_KEY``,
``SLUICE_SECRET_KEY``, ``SLUICE_TLS_CA``, ``SLUICE_TLS_CERT``, ``SLUICE_TLS_KEY``. Blank lines and ``#`` comments
are skipped; ``export`` in front of a line and quotes around a value are allowed, so the same file can be sourced by
a shell. A value applies where the environment does not set the variable; the access key and the secret key go
together (both from the environment when it sets either, else both from the profile), so a pair is never mixed
from two places. An endpoint or name servers given as options win over both.

A profile that holds a secret key must be readable by its owner only: one that group or others can read is
refused, as ssh refuses such a private key file, since a secret other users can read is no secret. So is a
``--secret-key-file``. Errors never repeat a line of the file: it may hold the secret.

A secret is never taken from the command line (other users see a process's arguments in ``ps``), and no help text
shows a value read from the environment or a profile.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypedDict

from broker.client.connection import ENDPOINT_ENV
from broker.client.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV
from broker.client.namesrv_client import NAMESRV_ENV
from broker.client.tls import CA_ENV, CERT_ENV, KEY_ENV
from broker.errors import InvalidArgumentError

PROFILE_ENV = "SLUICE_PROFILE"
PROFILE_KEYS = (ENDPOINT_ENV, NAMESRV_ENV, ACCESS_KEY_ENV, SECRET_KEY_ENV, CA_ENV, CERT_ENV, KEY_ENV)
MAX_PROFILE_BYTES = 16 * 1024  # seven settings of a few hundred characters each, with comments: a larger file is
# not a profile, and it is read whole
MAX_SECRET_FILE_BYTES = 4096  # a secret is at most 64 characters (broker/format/signature.py); allow a comment's room
PRIVATE_MODE_MASK = 0o077  # any bit for group or others


class ClientArgs(TypedDict):
    """The keyword arguments every client takes (``Producer(**args)``, ``Admin(**args)``)."""

    endpoint: str | None
    namesrv: str | None
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    access_key: str | None
    secret_key: str | None


@dataclass(frozen=True)
class Profile:
    path: str = ""
    values: dict[str, str] = field(default_factory=dict, repr=False)


def _open_private(path: str, what: str, holds_secret: bool, limit_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of a file (at most ``limit_bytes``) and its status, read from one descriptor so that the mode
    checked is the mode of the file read. ``holds_secret``: refused unless private."""
    try:
        with open(Path(path).expanduser(), "rb") as f:
            info = os.fstat(f.fileno())
            data = f.read(limit_bytes + 1)
    except OSError as e:
        raise InvalidArgumentError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > limit_bytes:
        raise InvalidArgumentError(f"{what} {path} is over {limit_bytes} bytes; is it the right file?")
    if holds_secret:
        refuse_if_shared(path, what, info)
    return data, info


def refuse_if_shared(path: str, what: str, info: os.stat_result) -> None:
    """InvalidArgumentError when a regular file holding a secret can be read by group or others."""
    if stat.S_ISREG(info.st_mode) and info.st_mode & PRIVATE_MODE_MASK:
        mode = stat.S_IMODE(info.st_mode)
        raise InvalidArgumentError(
            f"{what} {path} holds a secret key but its permissions {mode:04o} let other users read it; it was not "
            f"used. A secret others can read is no secret (ssh refuses such key files too): chmod 600 {path}"
        )


def load_profile(path: str) -> Profile:
    """The settings of a profile file (module docstring); InvalidArgumentError naming the line that is wrong."""
    data, info = _open_private(path, "profile", False, MAX_PROFILE_BYTES)  # private only when it holds a secret
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"profile {path} is not UTF-8 text") from None
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise InvalidArgumentError(f"profile {path}, line {number}: not KEY=VALUE")
        if key not in PROFILE_KEYS:
            raise InvalidArgumentError(
                f"profile {path}, line {number}: unknown setting {key[:40]!r}; a profile sets {', '.join(PROFILE_KEYS)}"
            )
        if key in values:
            raise InvalidArgumentError(f"profile {path}, line {number}: {key} is set twice")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    if values.get(SECRET_KEY_ENV):
        refuse_if_shared(path, "profile", info)
    return Profile(path, values)


def profile_of(args: argparse.Namespace) -> Profile:
    """The profile a command names (``--profile``, else ``$SLUICE_PROFILE``); an empty one when there is none."""
    path = getattr(args, "profile", None) or os.environ.get(PROFILE_ENV) or ""
    return load_profile(path) if path else Profile()


def _setting(name: str, profile: Profile) -> str | None:
    return os.environ.get(name) or profile.values.get(name) or None


def credentials_source(profile: Profile) -> tuple[str | None, str | None, str]:
    """(access key, secret key, where they came from: "the environment", "profile FILE" or "")."""
    env = (os.environ.get(ACCESS_KEY_ENV) or None, os.environ.get(SECRET_KEY_ENV) or None)
    if any(env):
        access, secret, where = env[0], env[1], "the environment"
    else:
        access, secret = profile.values.get(ACCESS_KEY_ENV) or None, profile.values.get(SECRET_KEY_ENV) or None
        where = f"profile {profile.path}" if access or secret else ""
    if bool(access) != bool(secret):
        raise InvalidArgumentError(f"{where} sets only one of {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}; set both")
    return access, secret, where


def client_args(args: argparse.Namespace) -> ClientArgs:
    """What a command's client connects with: options, then the environment, then the profile (module docstring).
    Records on ``args`` where credentials came from, for the hint a refused command prints."""
    profile = profile_of(args)
    endpoint, namesrv = getattr(args, "endpoint", None), getattr(args, "namesrv", None)
    if not (endpoint or namesrv or os.environ.get(ENDPOINT_ENV) or os.environ.get(NAMESRV_ENV)):
        # the client's own rule: an endpoint wins over name servers
        endpoint = profile.values.get(ENDPOINT_ENV) or None
        namesrv = None if endpoint else profile.values.get(NAMESRV_ENV) or None
    access, secret, where = credentials_source(profile)
    args.credentials_from = where
    return ClientArgs(endpoint=endpoint, namesrv=namesrv, tls_ca=_setting(CA_ENV, profile),
                      tls_cert=_setting(CERT_ENV, profile), tls_key=_setting(KEY_ENV, profile), access_key=access,
                      secret_key=secret)


def read_secret_file(path: str, stdin: IO[bytes] | None = None) -> str:
    """A secret key from a file (``-``: standard input), surrounding whitespace removed. A regular file must be
    private, as a profile."""
    if path == "-":
        data = (stdin or sys.stdin.buffer).read(MAX_SECRET_FILE_BYTES + 1)
        if len(data) > MAX_SECRET_FILE_BYTES:
            raise InvalidArgumentError(f"standard input is over {MAX_SECRET_FILE_BYTES} bytes; a secret key is short")
    else:
        data, _ = _open_private(path, "secret key file", True, MAX_SECRET_FILE_BYTES)
    try:
        secret = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"secret key file {path} is not UTF-8 text") from None
    if not secret:
        raise InvalidArgumentError(f"secret key file {path} is empty")
    return secret

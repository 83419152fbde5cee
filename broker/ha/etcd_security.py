"""How a broker in controller mode proves itself to etcd and knows it talks to the real etcd (BrokerConfig fields,
``sluice broker`` flags in brackets). Whoever can write the group's keys in etcd decides who is master, so etcd
holding them must be as closed as the brokers are.

* ``etcd_ca_file`` (``--etcd-ca-file``): the PEM CA that signed etcd's server certificates. Set, every call goes
  over HTTPS and etcd's certificate must come from it (no one in the path reads or changes the group's state).
* ``etcd_cert_file`` / ``etcd_key_file`` (``--etcd-cert-file``, ``--etcd-key-file``): a client certificate and its
  key, for an etcd started with ``--client-cert-auth`` (it accepts clients with a certificate from its
  ``--trusted-ca-file`` only; with auth enabled as well, the certificate's common name is the etcd user).
* ``etcd_user`` (``--etcd-user``) and its password, for an etcd with auth enabled (``etcdctl auth enable``): the
  broker authenticates (``/v3/auth/authenticate``) and sends the token etcd gives in the ``Authorization`` header,
  and authenticates again when etcd says the token expired. The user needs read and write on ``/sluice/`` (a
  role granted that prefix).
* The password comes from ``etcd_password_file`` (``--etcd-password-file``) or the ``SLUICE_ETCD_PASSWORD``
  environment variable, never from the command line or the config file: a command line is readable by every local
  user (``ps``, ``/proc/PID/cmdline``) and stays in shell histories, and config files are often shared or
  committed.

A password is refused without TLS unless every etcd endpoint is a loopback address: it, and the token etcd answers
with, would otherwise cross the network in clear. A refusal from etcd is an error with a response code
(etcd_client.py): UNAUTHENTICATED for a TLS connection refused either way or credentials refused, NO_PERMISSION for
a user without rights on the keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from broker.errors import InvalidArgumentError

PASSWORD_ENV = "SLUICE_ETCD_PASSWORD"
MAX_PASSWORD_BYTES = 4096  # etcd keeps bcrypt hashes, which read 72 bytes at most; anything longer is not a password


@dataclass(frozen=True)
class EtcdSecurity:
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    user: str = ""
    password: str = field(default="", repr=False)

    @property
    def protocol(self) -> str:
        return "https" if self.ca_file else "http"


def read_password(path: str) -> str:
    try:
        size = os.path.getsize(path)
        if size > MAX_PASSWORD_BYTES:
            raise InvalidArgumentError(f"etcd_password_file {path} is {size} bytes; a password is at most "
                                       f"{MAX_PASSWORD_BYTES}")
        with open(path, encoding="utf-8") as f:
            password = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgumentError(f"cannot read etcd_password_file {path}: {e}") from None
    if not password:
        raise InvalidArgumentError(f"etcd_password_file {path} is empty")
    return password


def _readable(name: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise InvalidArgumentError(f"cannot read {name} {path}: {e.strerror}") from None


def from_config(
    *, ca_file: str, cert_file: str, key_file: str, user: str, password_file: str,
    endpoints: tuple[tuple[str, int], ...], read_files: bool = True,
) -> EtcdSecurity:
    """The settings, checked; InvalidArgumentError naming the first that cannot work."""
    from broker.ha.replication_settings import is_loopback

    given = {"etcd_ca_file": ca_file, "etcd_cert_file": cert_file, "etcd_key_file": key_file, "etcd_user": user,
             "etcd_password_file": password_file}
    if not endpoints:
        named = [name for name, value in given.items() if value]
        if named:
            raise InvalidArgumentError(f"{', '.join(named)} need controller mode (controller = etcd://HOST:PORT)")
        return EtcdSecurity()
    if bool(cert_file) != bool(key_file):
        raise InvalidArgumentError("give etcd_cert_file and etcd_key_file together (a client certificate and its key)")
    if cert_file and not ca_file:
        raise InvalidArgumentError("a client certificate for etcd (etcd_cert_file) needs TLS: give etcd_ca_file, the "
                                   "CA that signed etcd's server certificate")
    if read_files:
        for name in ("etcd_ca_file", "etcd_cert_file", "etcd_key_file"):
            if given[name]:
                _readable(name, given[name])
    password = ""
    if password_file:
        password = read_password(password_file) if read_files else "?"
    elif user:
        password = os.environ.get(PASSWORD_ENV, "")
    if user and not password:
        raise InvalidArgumentError(f"etcd_user {user!r} needs its password: etcd_password_file "
                                   f"(--etcd-password-file) or ${PASSWORD_ENV}")
    if password and not user:
        raise InvalidArgumentError("an etcd password without etcd_user (--etcd-user): name the user too")
    if password and not ca_file and not all(is_loopback(host) for host, _ in endpoints):
        raise InvalidArgumentError(
            "an etcd password without TLS would cross the network in clear (and the token etcd answers with): give "
            "etcd_ca_file (--etcd-ca-file), or reach etcd on a loopback address only"
        )
    return EtcdSecurity(ca_file, cert_file, key_file, user, password)

"""The ``sluice`` command line's grammar: every command and option, each with its help text."""

from __future__ import annotations

import argparse
from importlib import metadata
from typing import Any

from broker.address import DEFAULT_PORT
from broker.cli.admin_cmd import cmd_query, cmd_stats, cmd_topic
from broker.cli.args import datetime_ms, int_at_least, int_between, time_ms, timestamp_ms
from broker.cli.broker_cmd import cmd_broker, cmd_namesrv
from broker.cli.cluster_cmd import cmd_cluster
from broker.cli.consume import cmd_consume
from broker.cli.groups import RESET_RULE, cmd_group
from broker.cli.profile import PROFILE_ENV
from broker.cli.send import cmd_send
from broker.cli.transactions import cmd_tx
from broker.cli.users import ACTIONS_HELP, RESOURCE_HELP, SHOWN_ONCE, cmd_acl, cmd_user
from broker.client.connection import DEFAULT_ENDPOINT, ENDPOINT_ENV
from broker.client.namesrv_client import DEFAULT_NAMESRV_PORT, NAMESRV_ENV

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
MAX_QUERY_RESULTS = 4096  # the broker's own bound on one key query

DESCRIPTION = """\
Sluice: a RocketMQ-style message broker. `sluice broker` runs one; the other commands talk to a running broker."""

EPILOG = f"""\
Client commands take --endpoint HOST:PORT (default ${ENDPOINT_ENV}, else {DEFAULT_ENDPOINT}; an IPv6 address goes
in brackets: [::1]:{DEFAULT_PORT}) or, for a cluster, --namesrv HOST:PORT[,HOST:PORT] (default ${NAMESRV_ENV}), and
--json (machine-readable output). TLS: an https:// endpoint, or $SLUICE_TLS_CA (and $SLUICE_TLS_CERT,
$SLUICE_TLS_KEY for mutual TLS), PEM files. Credentials, for a broker run with --auth: $SLUICE_ACCESS_KEY and
$SLUICE_SECRET_KEY (never on the command line). --profile FILE (default $SLUICE_PROFILE): a file of KEY=VALUE lines
setting any of these variables where the environment does not; one that holds a secret key must be private (chmod
600). Tables and JSON go to stdout, errors to stderr. Exit status: 0 done, 1 refused or failed (one `error:`
line), 2 bad usage, 130 interrupted (Ctrl-C).
`sluice COMMAND --help` describes each command."""


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (their lists and examples keep their lines)."""


def version() -> str:
    try:
        return metadata.version("sluice")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description=DESCRIPTION, epilog=EPILOG, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"sluice {version()}")
    parser.add_argument("--log-level", default="WARNING", type=str.upper, choices=LOG_LEVELS,
                        help="logging level on stderr (default WARNING; INFO for `sluice broker`)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str = "", with_client: bool = True) -> argparse.ArgumentParser:
        return add_command(sub, name, summary, description, client=with_client)

    _broker(command("broker", "run a broker in the foreground", BROKER_TEXT, with_client=False))
    _namesrv(command("namesrv", "run a name server in the foreground (cluster mode)", NAMESRV_TEXT,
                     with_client=False))
    _cluster(command("cluster", "the brokers of a cluster, as the name servers know them", with_client=False))
    _topic(command("topic", "create, list, delete or describe topics", with_client=False))
    _send(command("send", "send messages: --body or --size N, else one message per line of stdin", SEND_TEXT))
    _consume(command("consume", "print the messages of a topic and commit them for a group", CONSUME_TEXT))
    _query(command("query", "find messages by key (and store time) or by message id", with_client=False))
    _group(command("group", "consumer groups: list them, their lag, reset their offsets", with_client=False))
    command("stats", "broker statistics (counters since start, store sizes)").set_defaults(func=cmd_stats)
    _tx(command("tx", "transactions: list, commit or roll back (one id, or every open one by prefix)",
                with_client=False))
    _user(command("user", "users of a broker run with --auth: create, update, delete, list (super users only)",
                  USER_TEXT, with_client=False))
    _acl(command("acl", "access control entries of users: grant, revoke, list (super users only)", ACL_TEXT,
                 with_client=False))
    return parser


def client_options() -> argparse.ArgumentParser:
    """--endpoint and --json, for every command that talks to a broker."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--endpoint", default=None, metavar="HOST:PORT[,HOST:PORT]",
                        help=f"the broker (default ${ENDPOINT_ENV}, else {DEFAULT_ENDPOINT}); with several, the first "
                             "that answers")
    client.add_argument("--namesrv", default=None, metavar="HOST:PORT[,HOST:PORT]",
                        help=f"name servers of a cluster, instead of --endpoint (default ${NAMESRV_ENV}); commands "
                             "then act on every broker of the topic or cluster")
    client.add_argument("--json", action="store_true", help="machine-readable JSON output")
    client.add_argument("--profile", default=None, metavar="FILE",
                        help=f"KEY=VALUE settings (endpoint, credentials, TLS files) used where the environment sets "
                             f"none (default ${PROFILE_ENV}); mode 600 when it holds a secret key")
    return client


def add_command(
    parent: Any, name: str, summary: str, description: str = "", *, client: bool = True, exact: bool = False
) -> argparse.ArgumentParser:
    """A (sub-)command whose --help starts with its one-line summary, then ``description`` as written. ``exact``:
    options only as spelled in full (so ``--secret-key S`` is refused, not read as ``--secret-key-file S``)."""
    text = f"{summary[0].upper()}{summary[1:]}." + (f"\n\n{description}" if description else "")
    parser: argparse.ArgumentParser = parent.add_parser(
        name, parents=[client_options()] if client else [], help=summary, description=text, formatter_class=Formatter,
        allow_abbrev=not exact,
    )
    return parser


BROKER_TEXT = f"""\
Data goes to --store (created when missing). Files are allocated whole: the first message takes a 1 GiB
commit-log file, the first indexed key a ~420 MB key index, each queue a 6 MB consume-queue file. Prints one line
with `ready on HOST:PORT` once it accepts requests. SIGTERM stops it cleanly with exit status 0, Ctrl-C with 130.
Command-line options win over the --config file.
Examples:
  sluice broker --store ./store
  sluice broker --store /var/lib/sluice --listen 0.0.0.0:{DEFAULT_PORT} --flush sync"""


def _broker(b: argparse.ArgumentParser) -> None:
    b.add_argument("--store", default=None, metavar="DIR", help="store directory (default ~/store)")
    b.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help=f"address to listen on (default 0.0.0.0:{DEFAULT_PORT}); a missing port means {DEFAULT_PORT}, "
                        "port 0 any free port, an IPv6 address goes in brackets: [::1]:0")
    b.add_argument("--flush", choices=["async", "sync"], default=None,
                   help="async (default): acknowledge once written to memory, flushed within 500 ms; sync: "
                        "acknowledge once on disk")
    b.add_argument("--config", default=None, metavar="FILE",
                   help="broker settings file (.json or .toml; docs/operations.md lists the settings)")
    b.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics over HTTP on this port (0: any free port; default: none)")
    b.add_argument("--python-cpus", default=None, metavar="auto|off|LIST",
                   help="CPUs for the broker's Python threads: auto (one CPU, the default), off, or a list like 2,3")
    c = b.add_argument_group("cluster mode (docs/cluster.md)")
    c.add_argument("--namesrv", default=None, metavar="HOST:PORT[,HOST:PORT]",
                   help="name servers to register with (default: none, a broker on its own)")
    c.add_argument("--cluster", default=None, metavar="NAME", help="cluster name (default DefaultCluster)")
    c.add_argument("--broker-name", default=None, metavar="NAME", help="broker group name (default: this host's name)")
    c.add_argument("--broker-id", type=int_at_least(0), default=None, metavar="N",
                   help="id in the broker group; 0 (the default) is the master")
    c.add_argument("--advertise", default=None, metavar="HOST:PORT",
                   help="address registered for clients (default: the listen address, or this host's)")
    b.add_argument("--remoting-listen", default=None, metavar="HOST:PORT",
                   help="also serve RocketMQ's remoting protocol (RocketMQ 4 clients) on this address, registered "
                        "with the name servers (default: none; RocketMQ's port is 10911); docs/remoting.md")
    c.add_argument("--register-interval-ms", type=int_at_least(1), default=None, metavar="MS",
                   help="how often to register with the name servers when nothing changed (default 30000)")
    _tls(b)
    a = b.add_argument_group("authentication and authorization (docs/security.md)")
    a.add_argument("--auth", action="store_true", default=None,
                   help="require signed requests and check every call against the users' access control entries; "
                        "the first super user comes from $SLUICE_ROOT_ACCESS_KEY and $SLUICE_ROOT_SECRET_KEY")
    a.add_argument("--allow-plaintext-auth", action="store_true", default=None,
                   help="allow --auth without TLS (signed headers can then be read and replayed within the window)")
    a.add_argument("--auth-window-s", type=int, default=None, metavar="S",
                   help="accept signatures made at most S seconds from this broker's clock (default 900)")
    _etcd(b)
    _replication(b)
    b.set_defaults(func=cmd_broker, log_level_default="INFO")


class _PasswordRefused(argparse.Action):
    """``--etcd-password``: refused, with the way that works (and so not read as an abbreviation of
    ``--etcd-password-file``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} is not taken on the command line, where every local user can read it (ps): "
                     "give --etcd-password-file FILE or $SLUICE_ETCD_PASSWORD")


def _replication(b: argparse.ArgumentParser) -> None:
    r = b.add_argument_group("replication (docs/replication.md)")
    r.add_argument("--role", type=str.upper, choices=["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"], default=None,
                   help="classic mode (a fixed master, no failover): this broker's role in its group; a slave takes "
                        "--broker-id 1 or more")
    r.add_argument("--controller", default=None, metavar="etcd://HOST:PORT[,HOST:PORT]",
                   help="controller mode (automatic failover): etcd decides which replica of the group is master; "
                        "every replica is started the same way")
    r.add_argument("--ha-listen", default=None, metavar="HOST:PORT",
                   help="replication endpoint (default: the listen host, client port + 1)")
    r.add_argument("--ha-secret-file", default=None, metavar="FILE",
                   help="file (readable by its owner only) holding the group's shared secret; required unless the "
                        "replication endpoint is on loopback")
    r.add_argument("--min-insync-replicas", type=int_at_least(1), default=None, metavar="N",
                   help="SYNC_MASTER and controller mode: refuse writes while fewer replicas (the master counts) "
                        "are in sync (default 2)")


def _etcd(b: argparse.ArgumentParser) -> None:
    e = b.add_argument_group("etcd, controller mode (docs/replication.md)")
    e.add_argument("--etcd-ca-file", default=None, metavar="FILE",
                   help="PEM CA of etcd's server certificates: reach etcd over HTTPS, trusting this CA only")
    e.add_argument("--etcd-cert-file", default=None, metavar="FILE",
                   help="PEM client certificate for an etcd run with --client-cert-auth (needs --etcd-ca-file)")
    e.add_argument("--etcd-key-file", default=None, metavar="FILE", help="the client certificate's PEM key")
    e.add_argument("--etcd-user", default=None, metavar="NAME", help="etcd user, for an etcd with auth enabled")
    e.add_argument("--etcd-password-file", default=None, metavar="FILE",
                   help="file holding the etcd user's password (or $SLUICE_ETCD_PASSWORD; never on the command line)")
    e.add_argument("--etcd-password", action=_PasswordRefused, help=argparse.SUPPRESS)


def _tls(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("TLS (docs/security.md); the files are read again when they change")
    t.add_argument("--tls-cert", default=None, metavar="FILE", help="serve TLS with this PEM certificate (chain)")
    t.add_argument("--tls-key", default=None, metavar="FILE", help="the certificate's PEM private key")
    t.add_argument("--tls-ca", default=None, metavar="FILE",
                   help="PEM CA file: client certificates must come from it, and this process's own calls to other "
                        "servers trust it (default: the system's CAs)")
    t.add_argument("--tls-client-auth", choices=["none", "request", "require"], default=None,
                   help="client certificates: none (default), request, require (mutual TLS; needs --tls-ca)")


NAMESRV_TEXT = f"""\
Keeps the cluster's routes in memory, from what brokers register; stateless (run two or more for availability,
each on its own). Prints one line with `ready on HOST:PORT`; SIGTERM stops it with exit status 0.
Brokers register by signing as the cluster's root user: the name server takes it from $SLUICE_ROOT_ACCESS_KEY and
$SLUICE_ROOT_SECRET_KEY (the brokers' too) and does not start without it, unless --allow-anonymous-registration.
Example:
  export SLUICE_ROOT_ACCESS_KEY=root SLUICE_ROOT_SECRET_KEY="$(cat /run/secrets/sluice-root)"
  sluice namesrv --listen 0.0.0.0:{DEFAULT_NAMESRV_PORT}"""


def _namesrv(n: argparse.ArgumentParser) -> None:
    n.add_argument("--listen", default=f"0.0.0.0:{DEFAULT_NAMESRV_PORT}", metavar="HOST:PORT",
                   help=f"address to listen on (default 0.0.0.0:{DEFAULT_NAMESRV_PORT}; port 0: any free port)")
    n.add_argument("--broker-expire-ms", type=int_at_least(1), default=120_000, metavar="MS",
                   help="drop a broker from routes when it has not registered for this long (default 120000)")
    n.add_argument("--allow-anonymous-registration", action="store_true",
                   help="start without the root user: anyone who reaches the port may then register and unregister "
                        "brokers, and brokers with --auth refuse to register here; for tests and development only")
    n.add_argument("--remoting-listen", default=None, metavar="HOST:PORT",
                   help="also serve RocketMQ's remoting protocol (RocketMQ 4 clients, mqadmin) on this address "
                        "(default: none; RocketMQ's port is 9876; port 0: any free port); docs/remoting.md")
    _tls(n)
    n.set_defaults(func=cmd_namesrv, log_level_default="INFO")


def _cluster(c: argparse.ArgumentParser) -> None:
    csub = c.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_command(csub, "list", "every live broker: cluster, name, id, role, address, topics, last registration and "
                              "put rate (needs --namesrv)")
    c.set_defaults(func=cmd_cluster)


def _topic(t: argparse.ArgumentParser) -> None:
    tsub = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    tc = add_command(tsub, "create", "create a topic with a number of queues (each an ordered log)")
    tc.add_argument("topic", help="topic name: letters, digits, %%, |, _ and -, at most 127 characters")
    tc.add_argument("--queues", type=int_at_least(1), default=8, metavar="N", help="number of queues (default 8)")
    tc.add_argument("--if-not-exists", action="store_true", help="an existing topic is not an error")
    where = tc.add_mutually_exclusive_group()
    where.add_argument("--cluster", default=None, metavar="NAME",
                       help="with --namesrv: on every master of this cluster (default: of the only cluster)")
    where.add_argument("--broker", default=None, metavar="NAME", help="with --namesrv: on this broker only")
    add_command(tsub, "list", "list every topic: name, queues, RocketMQ permission bits (6: read and write)")
    td = add_command(tsub, "delete", "delete a topic with its messages and every group's offsets on it")
    td.add_argument("topic", help="the topic to delete")
    tq = add_command(tsub, "describe", "each queue of a topic (per broker in a cluster): min offset, max offset, "
                                       "messages")
    tq.add_argument("topic", help="the topic to describe")
    t.set_defaults(func=cmd_topic)


SEND_TEXT = """\
Without --queue, each batch of 1000 is spread over the topic's queues from a random first queue (the Python
client's round-robin). Ctrl-C stops after the batch being sent is answered and says how many messages were sent and
acknowledged (exit status 130).
Examples:
  sluice send orders --body '{"id": 1}' --tags created --keys order-1 --property region=eu
  sluice send load-test --count 100000 --size 1024
  seq 10 | sluice send numbers"""


def _send(s: argparse.ArgumentParser) -> None:
    s.add_argument("topic", help="topic to send to (created on the first send when the broker auto-creates topics)")
    s.add_argument("--tags", default=None, metavar="TAG", help="the messages' tag (what --tags filters on)")
    s.add_argument("--keys", default=None, metavar="K1,K2", help="comma-separated message keys (for `query key`)")
    s.add_argument("--property", action="append", metavar="NAME=VALUE",
                   help="a user property (repeatable; what --sql filters on)")
    s.add_argument("--body", default=None, metavar="TEXT", help="the message body (UTF-8 text)")
    s.add_argument("--count", type=int_at_least(1), default=None, metavar="N",
                   help="number of messages with --body or --size (default 1)")
    s.add_argument("--size", type=int_at_least(0), default=None, metavar="BYTES",
                   help="body of this many generated bytes (instead of --body)")
    s.add_argument("--queue", type=int_at_least(0), default=None, metavar="ID",
                   help="send every message to this queue (default: spread over the queues)")
    s.add_argument("--broker", default=None, metavar="NAME", help="with --namesrv: the broker of --queue")
    s.set_defaults(func=cmd_send)


CONSUME_TEXT = """\
Starts at --from, prints each message (queue:offset, id, tags, keys, user properties, body), and at the end commits
for --group the offsets after the last printed message of each queue. Ctrl-C stops, commits what was printed and
exits with 130.
Examples:
  sluice consume orders --group audit --from earliest
  sluice consume orders --group audit --follow --sql "region = 'eu' AND amount > 100\""""


def _consume(c: argparse.ArgumentParser) -> None:
    c.add_argument("topic", help="topic to read")
    c.add_argument("--group", required=True, help="consumer group whose offsets are read and committed")
    c.add_argument("--from", dest="origin", choices=["earliest", "latest", "committed"], default="committed",
                   help="start position (default committed: the group's offsets, earliest where it has none)")
    c.add_argument("--follow", action="store_true", help="keep waiting for new messages (Ctrl-C to stop)")
    f = c.add_mutually_exclusive_group()
    f.add_argument("--tags", default="*", metavar="EXPR", help="tag expression, e.g. 'TagA || TagB' (default *)")
    f.add_argument("--sql", default=None, metavar="EXPR",
                   help="SQL92 selector over the properties (TAGS included), e.g. \"region = 'eu' AND amount > 100\"")
    c.add_argument("--max", type=int_at_least(1), default=None, metavar="N", help="stop after this many messages")
    c.add_argument("--no-commit", action="store_true", help="do not commit the group's offsets at the end")
    c.set_defaults(func=cmd_consume)


QUERY_KEY_TEXT = """\
The newest messages (at most --max) with KEY among their keys, or as their UNIQ_KEY, listed oldest first.
TIME is milliseconds since the epoch or ISO 8601: 2026-11-26T10:00:00 (local time), 2026-11-26T10:00:00Z,
2026-11-26T10:00:00+01:00, 2026-11-26.
Example:
  sluice query key orders order-1 --begin 2026-11-26T08:00:00Z --end 2026-11-26T09:00:00Z"""


def _query(q: argparse.ArgumentParser) -> None:
    qsub = q.add_subparsers(dest="kind", required=True, metavar="KIND")
    qk = add_command(qsub, "key", "messages of a topic with a key, optionally within a store-time range",
                     QUERY_KEY_TEXT)
    qk.add_argument("topic", help="topic to search")
    qk.add_argument("key", help="a message key (or UNIQ_KEY)")
    qk.add_argument("--begin", type=time_ms, default=None, metavar="TIME", help="stored at or after this time")
    qk.add_argument("--end", type=time_ms, default=None, metavar="TIME", help="stored at or before this time")
    qk.add_argument("--max", type=int_between(1, MAX_QUERY_RESULTS), default=64, metavar="N",
                    help=f"at most this many messages, the newest (default 64, at most {MAX_QUERY_RESULTS})")
    qi = add_command(qsub, "id", "one message by its message id (as `send` prints it)")
    qi.add_argument("msg_id", help="the message id (32 hex characters)")
    q.set_defaults(func=cmd_query)


RESET_TEXT = RESET_RULE + """

Examples:
  sluice group reset-offsets billing --topic orders --to-earliest --dry-run
  sluice group reset-offsets billing --topic orders --to-datetime 2026-11-26T08:00:00Z"""


def _group(g: argparse.ArgumentParser) -> None:
    gsub = g.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_command(gsub, "list", "every group with committed offsets, live consumers or settings: its live consumers "
                              "and its topics")
    gl = add_command(gsub, "lag", "a group's lag per queue: the queue's max offset, the committed offset, the lag")
    gl.add_argument("group", help="the consumer group")
    gl.add_argument("--topic", default=None, help="only this topic (default: every topic of the group)")
    gr = add_command(gsub, "reset-offsets", "move a group's committed offsets on a topic to the earliest or latest "
                                            "message, an offset or a time", RESET_TEXT)
    gr.add_argument("group", help="the consumer group")
    gr.add_argument("--topic", required=True, help="the topic whose offsets move")
    to = gr.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="each queue's first message still stored")
    to.add_argument("--to-latest", action="store_true", help="each queue's end (nothing left to consume)")
    to.add_argument("--to-offset", type=int_at_least(0), default=None, metavar="N",
                    help="this queue offset (moved into the queue's [min, max])")
    to.add_argument("--to-datetime", type=datetime_ms, default=None, metavar="ISO8601",
                    help="the first message stored at or after this time (local time without a zone)")
    to.add_argument("--to-timestamp", type=timestamp_ms, default=None, metavar="MS",
                    help="the same, in milliseconds since the epoch")
    gr.add_argument("--queue", type=int_at_least(0), default=None, metavar="ID", help="only this queue")
    gr.add_argument("--dry-run", action="store_true", help="show the offsets that would be set; change nothing")
    g.set_defaults(func=cmd_group)


def _tx(x: argparse.ArgumentParser) -> None:
    xsub = x.add_subparsers(dest="action", required=True, metavar="ACTION")
    xl = add_command(xsub, "list", "transactions the broker knows, by id: status, half messages, checks")
    xl.add_argument("prefix", nargs="?", default="", help="only ids starting with this (default: every one)")
    xl.add_argument("--status", choices=["OPEN", "ENDING", "COMMITTED", "ROLLED_BACK"], help="only this status")
    for name, verb in (("commit", "commit"), ("rollback", "roll back")):
        xe = add_command(
            xsub, name, f"{verb} one open transaction, or every open one by prefix",
            f"An ID the broker does not know is refused and nothing is recorded. A transaction that already ended "
            f"otherwise\n(a {name} of a {'rolled-back' if name == 'commit' else 'committed'} one) is left as it is, "
            "with exit status 1.",
        )
        xe.add_argument("target", metavar="ID", help="a transaction id (or, with --prefix, the start of ids)")
        xe.add_argument("--prefix", dest="prefix_mode", action="store_true",
                        help=f"{verb} every OPEN transaction whose id starts with ID")
    x.set_defaults(func=cmd_tx)


USER_TEXT = """\
Each broker keeps its own users (config/users.json), which a master replicates to its slaves; with --namesrv a
change goes to every live master of the cluster (--cluster or --broker narrows it). A change applies to the user's
next request. The root user, from the broker's $SLUICE_ROOT_ACCESS_KEY and $SLUICE_ROOT_SECRET_KEY, is changed
there, not here.
A secret key is never given on the command line: --secret-key-file FILE (- for stdin; a file must be mode 600), or
none, and `user create` generates one."""


def _where(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--cluster", default=None, metavar="NAME",
                       help="with --namesrv: every live master of this cluster (default: of the only cluster)")
    where.add_argument("--broker", default=None, metavar="NAME",
                       help="with --namesrv: this master only (its slaves follow it)")


def _secret_file(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--secret-key-file", default=None, metavar="FILE",
                   help=f"{what} (- for standard input); surrounding whitespace is dropped")


def _user(u: argparse.ArgumentParser) -> None:
    usub = u.add_subparsers(dest="action", required=True, metavar="ACTION")
    uc = add_command(usub, "create", "create a user", exact=True, description=f"""\
Without --secret-key-file a secret key is generated and printed on stdout,
{SHOWN_ONCE}.
Examples:
  sluice user create orders-app
  sluice user create ops --super --secret-key-file ops.secret""")
    uc.add_argument("access_key", metavar="ACCESS_KEY", help="1 to 64 letters, digits, '_', '.' and '-'")
    uc.add_argument("--super", dest="super_user", action="store_true",
                    help="a super user: passes every authorization check, may manage users")
    _secret_file(uc, "read the secret key from this file instead of generating one")
    _where(uc)
    uu = add_command(usub, "update", "change a user's secret key, super user flag or enabled flag", exact=True,
                     description="A disabled user is refused (UNAUTHENTICATED) from its next request on; --enable "
                                 "lets it in again.")
    uu.add_argument("access_key", metavar="ACCESS_KEY", help="the user")
    _secret_file(uu, "the user's new secret key")
    su = uu.add_mutually_exclusive_group()
    su.add_argument("--super", dest="super_user", action="store_true", default=None, help="make it a super user")
    su.add_argument("--no-super", dest="super_user", action="store_false", help="make it an ordinary user")
    en = uu.add_mutually_exclusive_group()
    en.add_argument("--enable", dest="enabled", action="store_true", default=None, help="let it in again")
    en.add_argument("--disable", dest="enabled", action="store_false", help="refuse its requests")
    _where(uu)
    ud = add_command(usub, "delete", "delete a user and its access control entries")
    ud.add_argument("access_key", metavar="ACCESS_KEY", help="the user")
    _where(ud)
    ul = add_command(usub, "list", "every user: access key, super user, enabled (never a secret key)")
    _where(ul)
    u.set_defaults(func=cmd_user)


ACL_TEXT = f"""\
An ordinary user may do only what its entries allow; anything else is refused (NO_PERMISSION). Super users pass.
Resources: {RESOURCE_HELP}.
Actions: {ACTIONS_HELP}.
The most specific matching entry decides (a name beats a prefix, a longer prefix a shorter one, anything beats *);
between equally specific entries Deny wins. See docs/security.md.
Examples:
  sluice acl grant orders-app --resource Topic:orders --actions Pub
  sluice acl grant billing --resource Group:billing --actions Sub
  sluice acl grant audit --resource 'Topic:*' --actions Sub --source-ip 10.0.0.0/8
  sluice acl revoke orders-app --resource Topic:orders"""


def _acl(a: argparse.ArgumentParser) -> None:
    asub = a.add_subparsers(dest="action", required=True, metavar="ACTION")
    ag = add_command(asub, "grant", "allow (or --deny) actions on a resource to a user",
                     "The actions join the user's entry with the same resource, decision and source networks, or "
                     "make a new one.")
    ag.add_argument("access_key", metavar="ACCESS_KEY", help="the user")
    ag.add_argument("--resource", required=True, metavar="R", help=RESOURCE_HELP)
    ag.add_argument("--actions", required=True, metavar="A,B", help=ACTIONS_HELP)
    ag.add_argument("--deny", action="store_true", help="a Deny entry instead of Allow")
    ag.add_argument("--source-ip", action="append", default=[], metavar="CIDR",
                    help="only for requests from this network (repeatable; default: from anywhere)")
    _where(ag)
    ar = add_command(asub, "revoke", "take actions on a resource away from a user (Allow and Deny entries alike)")
    ar.add_argument("access_key", metavar="ACCESS_KEY", help="the user")
    ar.add_argument("--resource", required=True, metavar="R", help="the resource, written as it was granted")
    ar.add_argument("--actions", default="", metavar="A,B", help="only these actions (default: every one)")
    _where(ar)
    al = add_command(asub, "list", "access control entries, of one user or of every user")
    al.add_argument("access_key", metavar="ACCESS_KEY", nargs="?", default="", help="only this user's")
    _where(al)
    a.set_defaults(func=cmd_acl)

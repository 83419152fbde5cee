"""``sluice broker`` and ``sluice namesrv``: run a broker (or a name server) in the foreground until SIGTERM (exit
0) or Ctrl-C (exit 130), then shut down cleanly (held pulls answered, offsets and topics saved, the store flushed
and its lock released)."""

from __future__ import annotations

import argparse
import faulthandler
import signal
import threading

from broker.cli.interrupt import INTERRUPTED_EXIT

STOP_POLL_S = 1.0  # the main thread looks for a stop signal this often


class StopSignals:
    """Installed, SIGTERM and SIGINT (Ctrl-C) set ``stop``: the command shuts down cleanly either way, and exits 130
    rather than 0 when Ctrl-C was among them (``interrupted``)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.received: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        self.stop.set()

    @property
    def interrupted(self) -> bool:
        return signal.SIGINT in self.received


def cmd_broker(args: argparse.Namespace) -> int:
    from broker.allocator import tune_malloc
    from broker.config import BrokerConfig
    from broker.server.broker_controller import BrokerController
    from broker.server.thread_names import ThreadNames
    from broker.server.thread_placement import start_placement

    tune_malloc()  # this process is the broker's own: see allocator.py for why and what it costs

    overrides = {"store_path": args.store, "listen": args.listen, "flush_disk_type": args.flush,
                 "metrics_port": args.metrics_port, "python_cpus": args.python_cpus, "namesrv_addr": args.namesrv,
                 "cluster_name": args.cluster, "broker_name": args.broker_name, "broker_id": args.broker_id,
                 "advertised_address": args.advertise, "register_interval_ms": args.register_interval_ms,
                 "tls_cert": args.tls_cert, "tls_key": args.tls_key, "tls_ca": args.tls_ca,
                 "tls_client_auth": args.tls_client_auth, "auth_enabled": args.auth,
                 "allow_plaintext_auth": args.allow_plaintext_auth, "auth_window_s": args.auth_window_s,
                 "remoting_listen": args.remoting_listen}
    overrides.update({"etcd_ca_file": args.etcd_ca_file, "etcd_cert_file": args.etcd_cert_file,
                      "etcd_key_file": args.etcd_key_file, "etcd_user": args.etcd_user,
                      "etcd_password_file": args.etcd_password_file})
    overrides.update({"role": args.role, "controller": args.controller, "ha_listen": args.ha_listen,
                      "ha_secret_file": args.ha_secret_file,
                      "min_insync_replicas": args.min_insync_replicas})
    config = (
        BrokerConfig.from_file(args.config, **overrides) if args.config else BrokerConfig.from_dict({}, **overrides)
    )
    signals = StopSignals()
    # `kill -USR1 PID` prints every thread's stack (a stuck replica, a hung test): the broker process's own, not an
    # embedded broker's host process, whose stderr may be no file at all
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    controller = BrokerController(config)
    controller.start()
    # after start: the threads to place exist (see thread_placement.py)
    start_placement(config.python_cpus, signals.stop)
    metrics = f", metrics on port {controller.metrics_port}" if controller.metrics_port is not None else ""
    if controller.remoting is not None:
        metrics += f", remoting on {controller.remoting.address}"
    print(f"sluice broker ready on {controller.address} (store {config.store_dir}, {config.flush_disk_type}{metrics})",
          flush=True)
    names = ThreadNames()  # gRPC starts workers on demand: named at each look for a stop (thread_names.py)
    names.apply()
    while not signals.stop.wait(STOP_POLL_S):
        names.apply()
    controller.shutdown()
    interrupted = signals.interrupted
    print(f"sluice broker stopped ({'interrupted' if interrupted else 'terminated'}); store {config.store_dir} closed "
          "cleanly", flush=True)
    return INTERRUPTED_EXIT if interrupted else 0


def cmd_namesrv(args: argparse.Namespace) -> int:
    """``sluice namesrv``: a name server until SIGTERM (exit 0) or Ctrl-C (exit 130)."""
    from broker.address import parse_listen
    from broker.namesrv import DEFAULT_NAMESRV_PORT, NameServer
    from broker.server.server_tls import ServerTls

    host, port = parse_listen(args.listen, DEFAULT_NAMESRV_PORT)
    tls = ServerTls.of(args.tls_cert or "", args.tls_key or "", args.tls_ca or "", args.tls_client_auth or "none")
    signals = StopSignals()
    from broker.auth.accounts import root_user_from_env

    # Only brokers signing as the root user of the environment may register; without one the name server does not
    # start unless registration is explicitly left open (broker/namesrv/name_server.py).
    remoting = parse_listen(args.remoting_listen, DEFAULT_NAMESRV_PORT) if args.remoting_listen else None
    server = NameServer(host, port, broker_expire_ms=args.broker_expire_ms, tls=tls, root=root_user_from_env(),
                        allow_anonymous_registration=args.allow_anonymous_registration,
                        remoting_listen=remoting)
    server.start()
    also = f", remoting on {server.remoting.address}" if server.remoting is not None else ""
    print(f"sluice namesrv ready on {server.address}{also}", flush=True)
    while not signals.stop.wait(STOP_POLL_S):
        pass
    server.shutdown()
    return INTERRUPTED_EXIT if signals.interrupted else 0

"""An election never puts the ``master`` key on lease 0 (a key that never expires): the soak found a group left
without a master for good after a failover under load. The lease keeper had lost its lease and was taking a new one
(``lease`` is 0 meanwhile) while the loop ran for election; the key went on lease 0, the winner was fenced at once
(its key was not on its lease), and every replica then waited for that key to expire, which it never does."""

from __future__ import annotations

import time

from broker.ha.controller import Controller, ControllerHooks
from broker.ha.etcd_client import Etcd, KeyValue
from broker.ha.etcd_process import EtcdProcess


class RenewingEtcd(Etcd):
    """An etcd client through which the controller's loop reads the master key just as its lease keeper drops the
    lost lease (the window between the keeper's reset and its next grant)."""

    controller: Controller | None = None

    def get(self, key: str) -> KeyValue | None:
        if self.controller is not None and key == self.controller.master_key:
            self.controller.lease = 0
        return super().get(key)


def test_an_election_puts_the_master_key_on_the_lease_it_read(etcd: EtcdProcess) -> None:
    client = RenewingEtcd([("127.0.0.1", etcd.client_port)])
    elected: list[object] = []
    hooks = ControllerHooks(follow=lambda _s: None, elected=elected.append, fenced=lambda _r: None)
    ctrl = Controller(client, cluster="C", broker_name="g", broker_id=1, address="127.0.0.1:1",
                      ha_address="127.0.0.1:2", store_id="s", lease_ttl_s=5, allow_unclean=False,
                      hooks=hooks)
    ctrl._keep_lease(time.monotonic())
    lease = ctrl.lease
    assert lease
    client.controller = ctrl
    ctrl._tick()
    client.controller = None
    assert elected, "the replica ran for election and won"
    master = client.get(ctrl.master_key)
    assert master is not None and master.lease == lease, master
    client.close()

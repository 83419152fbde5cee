"""The broker's remoting processor table: request code -> the processor that translates it to the broker's own
processors. A code missing here is answered ``REQUEST_CODE_NOT_SUPPORTED`` by the transport."""

from __future__ import annotations

from broker.remoting.client_processor import ClientProcessors
from broker.remoting.message_outcomes import Access
from broker.remoting.offset_processor import OffsetProcessors
from broker.remoting.processor import Processor
from broker.remoting.route_processor import BrokerRouteProcessor
from broker.server.broker_service import BrokerService


def broker_processors(service: BrokerService, access: Access | None = None,
                      clients: ClientProcessors | None = None) -> dict[int, Processor]:
    """``access``: the callers' rights (None: auth off); ``clients``: the membership processors, when the caller
    keeps them (their connections of each group: the transport's ``on_close``)."""
    table: dict[int, Processor] = {}
    table.update(OffsetProcessors(service.admin, access).processors())
    table.update((clients or ClientProcessors(service, access)).processors())
    open_routes = access is None or access.accounts is None  # under --auth, anonymous route reads hold less
    table.update(BrokerRouteProcessor(service, auto_create=open_routes, system_topics=open_routes).processors())
    return table

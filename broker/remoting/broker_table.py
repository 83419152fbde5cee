"""The broker's remoting processor table: request code -> the processor that translates it to the broker's own
processors. A code missing here is answered ``REQUEST_CODE_NOT_SUPPORTED`` by the transport."""

from __future__ import annotations

from broker.remoting.client_processor import ClientProcessors
from broker.remoting.offset_processor import OffsetProcessors
from broker.remoting.processor import Processor
from broker.remoting.route_processor import BrokerRouteProcessor
from broker.server.service import BrokerService


def broker_processors(service: BrokerService) -> dict[int, Processor]:
    table: dict[int, Processor] = {}
    table.update(OffsetProcessors(service.admin).processors())
    table.update(ClientProcessors(service).processors())
    table.update(BrokerRouteProcessor(service).processors())
    return table

"""The broker's remoting entries of message lookups and ``mqadmin``'s codes, built from a running broker in one call.

``admin_processors(controller, msg_ids)`` returns ``{request code: processor}`` for the query codes
(query_processor.py), the topic and broker codes (topic_admin_processor.py) and the consumer-group codes
(group_admin_processor.py); rights are checked through the broker's accounts when auth is on, as for the message
codes. ``msg_ids`` is the remoting address ids name (message_ids.py), shared with the send processor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.remoting.codes import RequestCode
from broker.remoting.group_admin_processor import GroupAdminProcessors
from broker.remoting.message_ids import RemotingIds
from broker.remoting.message_outcomes import Access
from broker.remoting.processor import Processor
from broker.remoting.query_processor import QueryProcessors
from broker.remoting.topic_admin_processor import TopicAdminProcessors

if TYPE_CHECKING:
    from broker.server.broker_controller import BrokerController


def admin_processors(controller: BrokerController, msg_ids: RemotingIds) -> dict[int, Processor]:
    service = controller.service
    assert service is not None, "build the processors of a started broker"
    access = Access.of(controller)
    broker_name = service.identity[1]
    table: dict[int, Processor] = {}
    table.update(QueryProcessors(service.admin, access, msg_ids).processors())
    table.update(TopicAdminProcessors(service.admin, access, broker_name, controller.stats).processors())
    table.update(GroupAdminProcessors(service, access, broker_name).processors())
    return table


# The request codes these processors answer (docs/remoting.md's table is checked against them).
ADMIN_CODES = (
    RequestCode.QUERY_MESSAGE, RequestCode.VIEW_MESSAGE_BY_ID, RequestCode.UPDATE_AND_CREATE_TOPIC,
    RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.GET_TOPIC_STATS_INFO, RequestCode.GET_BROKER_RUNTIME_INFO,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.GET_CONSUMER_CONNECTION_LIST,
    RequestCode.GET_CONSUME_STATS, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
)

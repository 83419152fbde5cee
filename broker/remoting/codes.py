"""RocketMQ's request and response codes, with RocketMQ's numbers (the wire carries only the number).

``RequestCode`` names every code Sluice's remoting front answers or sends, or means to: the name server's, the
broker's (what 4.x producers, consumers and ``mqadmin``'s everyday commands send), and the broker-to-client calls.
A code not named here is still answered (``REQUEST_CODE_NOT_SUPPORTED``): the table is what the front knows, not
what it accepts.

``WireCode`` is every code a 4.x client (or 5.x's remoting client) branches on. Sluice's own refusals carry
``broker.errors.ResponseCode``, which shares RocketMQ's numbers below 900; :func:`wire_code` maps the rest (Sluice
additions RocketMQ clients do not know) to the RocketMQ code whose client behaviour fits.
"""

from __future__ import annotations

from enum import IntEnum

from broker.errors import BrokerError
from broker.errors import ResponseCode as BrokerCode


class RequestCode(IntEnum):
    # client and admin -> broker
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    LITE_PULL_MESSAGE = 361  # 5.x
    QUERY_ASSIGNMENT = 400  # 5.x
    SET_MESSAGE_REQUEST_MODE = 401  # 5.x
    # 5.x pop consumption: these do not fit the binary header's int16 code, so they travel in JSON headers only
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    PEEK_MESSAGE = 200052
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151
    # broker -> client (the broker picks the opaque)
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    # client, admin and broker -> name server
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    GET_TOPICS_BY_CLUSTER = 224
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304


class WireCode(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29  # 5.x; a 4.x client throws on it without retrying, which is what a bad request needs
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202  # RocketMQ's spelling
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    # 5.x meanings (4.9 used 209..211 for ACL configuration failures, which Sluice never answers)
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    BROKER_NOT_EXIST = 211
    FLOW_CONTROL = 215
    NOT_LEADER_FOR_QUEUE = 501  # 5.x
    ILLEGAL_OPERATION = 604  # 5.x
    GO_AWAY = 1500  # 5.x


# Sluice's own refusal codes (900 and up) as RocketMQ codes. A 4.x sync producer retries another queue on
# SYSTEM_ERROR, SERVICE_NOT_AVAILABLE, NO_PERMISSION, TOPIC_NOT_EXIST, NO_BUYER_ID and NOT_IN_CURRENT_UNIT and
# throws on anything else, so: what another broker may take (not the master, too few replicas, a full limit here)
# becomes SERVICE_NOT_AVAILABLE; what no retry can fix (a bad argument or receipt handle) INVALID_PARAMETER;
# authentication failures NO_PERMISSION, as RocketMQ's ACL answers them.
_SLUICE_CODES = {
    BrokerCode.STORE_CORRUPTED: WireCode.SYSTEM_ERROR,
    BrokerCode.INVALID_ARGUMENT: WireCode.INVALID_PARAMETER,
    BrokerCode.INVALID_RECEIPT_HANDLE: WireCode.INVALID_PARAMETER,
    BrokerCode.LIMIT_EXCEEDED: WireCode.SERVICE_NOT_AVAILABLE,
    BrokerCode.NOT_ENOUGH_REPLICAS: WireCode.SERVICE_NOT_AVAILABLE,
    BrokerCode.NOT_MASTER: WireCode.SERVICE_NOT_AVAILABLE,
    BrokerCode.UNAUTHENTICATED: WireCode.NO_PERMISSION,
}


def wire_code(code: BrokerCode) -> WireCode:
    """The RocketMQ response code for one of Sluice's: the same number where RocketMQ has it."""
    mapped = _SLUICE_CODES.get(code)
    if mapped is not None:
        return mapped
    try:
        return WireCode(int(code))
    except ValueError:
        return WireCode.SYSTEM_ERROR


def error_code(error: BrokerError) -> WireCode:
    return wire_code(error.code)


def not_supported_remark(code: int, peer: str) -> str:
    """RocketMQ's remark for an unknown request code (clients log it as is)."""
    return f" request type {code} not supported (peer {peer})"

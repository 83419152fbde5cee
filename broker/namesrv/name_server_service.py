"""The name server's gRPC servicer: requests into route-table calls, results into responses.

Refusals travel as the broker's do (broker.proto.status): a gRPC status and the response code in the trailers.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from broker.errors import BrokerError, NoPermissionError, ResponseCode, shown
from broker.namesrv.route_table import QueueSpec, Registration, RouteTable, Runtime
from broker.proto import namesrv_pb2 as npb
from broker.proto import namesrv_pb2_grpc as npb_grpc
from broker.proto.status import RESPONSE_CODE_KEY, grpc_code_for

log = logging.getLogger(__name__)
R = TypeVar("R")


def now_ms() -> int:
    return int(time.time() * 1000)


def _answer(method: Callable[..., R]) -> Callable[..., R]:
    @functools.wraps(method)
    def wrapper(self: NameServerService, request: Any, context: grpc.ServicerContext) -> R:
        try:
            return method(self, request, context)
        except BrokerError as e:
            log.info("%s refused: %s (%s)", method.__name__, e.message, e.code.name)
            context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(e.code))),))
            context.abort(grpc_code_for(e.code), e.message)
        except Exception as e:
            if isinstance(e, grpc.RpcError):  # context.abort's own exception
                raise
            log.exception("%s failed unexpectedly", method.__name__)
            context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(ResponseCode.SYSTEM_ERROR))),))
            context.abort(grpc.StatusCode.INTERNAL, f"internal name server error ({type(e).__name__}); see its log")
        raise AssertionError("unreachable: context.abort raises")

    return wrapper


def runtime_from_pb(r: npb.BrokerRuntime) -> Runtime:
    return Runtime(r.put_messages_per_s, r.get_messages_per_s, r.commit_log_max_offset, r.uptime_ms)


def runtime_to_pb(r: Runtime) -> npb.BrokerRuntime:
    return npb.BrokerRuntime(put_messages_per_s=r.put_messages_per_s, get_messages_per_s=r.get_messages_per_s,
                             commit_log_max_offset=r.commit_log_max_offset, uptime_ms=r.uptime_ms)


class NameServerService(npb_grpc.NameServerServicer):
    def __init__(self, table: RouteTable, clock_ms: Callable[[], int] = now_ms, *, authenticated: bool) -> None:
        """``authenticated``: the auth gate (broker/auth/gate.py) runs in front of this servicer, so every
        registration that reaches it was signed as the cluster's root user."""
        self.table = table
        self.clock_ms = clock_ms
        self.authenticated = authenticated

    @_answer
    def RegisterBroker(self, request: npb.RegisterBrokerRequest, context: grpc.ServicerContext) -> Any:
        if request.require_authentication and not self.authenticated:
            raise NoPermissionError(
                f"broker {shown(request.broker_name)} runs with --auth and this name server takes registrations from "
                "anyone (--allow-anonymous-registration), so anyone could replace or remove its routes here: not "
                "registered. Start the name server with the cluster's root user instead"
            )
        topics = (
            {t.topic: QueueSpec(t.read_queue_nums, t.write_queue_nums, t.perm) for t in request.topics}
            if request.topics_included
            else None
        )
        reg = Registration(
            cluster=request.cluster, broker_name=request.broker_name, broker_id=request.broker_id,
            address=request.address, store_id=request.store_id, data_version=request.data_version, topics=topics,
            auto_create_topic_enable=request.auto_create_topic_enable, role=request.role or "MASTER",
            ha_address=request.ha_address, runtime=runtime_from_pb(request.runtime), epoch=request.epoch,
            in_sync=request.in_sync, lag_bytes=request.lag_bytes, remoting_address=request.remoting_address,
        )
        now = self.clock_ms()
        accepted = self.table.register(reg, now)
        master = self.table.master_of(request.broker_name, now)
        return npb.RegisterBrokerResponse(
            accepted=accepted, master_address=master.address if master else "",
            master_ha_address=master.ha_address if master else "", authenticated=self.authenticated,
        )

    @_answer
    def UnregisterBroker(self, request: npb.UnregisterBrokerRequest, context: grpc.ServicerContext) -> Any:
        self.table.unregister(request.broker_name, request.broker_id, request.store_id)
        return npb.UnregisterBrokerResponse()

    @_answer
    def GetRouteInfoByTopic(self, request: npb.GetRouteInfoRequest, context: grpc.ServicerContext) -> Any:
        route = self.table.route(request.topic, self.clock_ms())
        return npb.TopicRouteData(
            queue_datas=[
                npb.QueueData(broker_name=name, read_queue_nums=q.read_queue_nums,
                              write_queue_nums=q.write_queue_nums, perm=q.perm)
                for name, q in sorted(route.queues.items())
            ],
            broker_datas=[
                npb.BrokerData(cluster=cluster, broker_name=name, broker_addrs=addrs)
                for name, (cluster, addrs) in sorted(route.brokers.items())
            ],
        )

    @_answer
    def GetBrokerClusterInfo(self, request: npb.GetBrokerClusterInfoRequest, context: grpc.ServicerContext) -> Any:
        return npb.BrokerClusterInfo(
            brokers=[
                npb.BrokerLiveInfo(
                    cluster=s.live.cluster, broker_name=s.live.broker_name, broker_id=s.live.broker_id,
                    address=s.live.address, role=s.live.role, last_update_ms=s.live.last_update_ms,
                    data_version=s.live.data_version, topic_count=s.topic_count, runtime=runtime_to_pb(s.live.runtime),
                    auto_create_topic_enable=s.live.auto_create_topic_enable, ha_address=s.live.ha_address,
                    epoch=s.live.epoch, in_sync=s.live.in_sync, lag_bytes=s.live.lag_bytes,
                )
                for s in self.table.brokers(self.clock_ms())
            ]
        )

    @_answer
    def GetAllTopicList(self, request: npb.GetAllTopicListRequest, context: grpc.ServicerContext) -> Any:
        return npb.TopicList(topics=self.table.topic_names(self.clock_ms()))

"""END_TRANSACTION (37): a 4.x transactional producer's commit or rollback, translated into the broker's
``TransactionProcessor.end`` (what the gRPC ``EndTransaction`` calls: the same table, the same decision record, the
same markers).

A 4.x producer sends a half message with SEND_MESSAGE and sysFlag PREPARED (send_processor.py stores it as a
transactional send under its producer group and answers the transaction's id as ``transactionId``), runs its local
transaction, then ends it, usually one-way, with this header:

* ``producerGroup``; ``commitOrRollback``: 8 commit, 12 rollback, 0 "not known yet" (nothing is done: the
  transaction stays open and the broker's check-back asks again later);
* ``commitLogOffset``: the half's offset, which the client decodes from the offset message id the send answered.
  It names the transaction here, as in RocketMQ: a 4.x client's ``transactionId`` is the id Sluice answered, but
  clients that write their own (the message's UNIQ_KEY) exist, and the offset is exact for both;
* ``fromTransactionCheck``: true when the answer is to a CHECK_TRANSACTION_STATE (transaction_checks.py);
* ``tranStateTableOffset``, ``msgId``, ``transactionId``: read by nothing here (RocketMQ logs them).

The answer is SUCCESS with no fields (a one-way request gets none); a refusal is answered with its code (codes.py),
and a one-way one only logged, as RocketMQ does. Rights: the caller must be allowed to end the group's
transactions, the gRPC EndTransaction's row.
"""

from __future__ import annotations

import logging

from broker.errors import BrokerError, InvalidArgumentError, NotMasterError
from broker.format.send_checks import validate_producer_group
from broker.proto import sluice_pb2 as pb
from broker.remoting import header_fields as f
from broker.remoting.codes import RequestCode, WireCode, error_code
from broker.remoting.command import RemotingCommand
from broker.remoting.message_outcomes import MAX_REMARK_CHARS, Access, failure
from broker.remoting.message_replication import GroupReplication
from broker.remoting.processor import Answer, RequestContext
from broker.server.broker_service import end_transaction_of
from broker.server.transaction_processor import TransactionProcessor

log = logging.getLogger(__name__)

END_TRANSACTION = RequestCode.END_TRANSACTION
# MessageSysFlag's transaction types, as commitOrRollback carries them.
NOT_TYPE, COMMIT_TYPE, ROLLBACK_TYPE = 0, 8, 12


def refused(request: RemotingCommand, e: BrokerError) -> RemotingCommand:
    """A refusal answered with RocketMQ's code for it (codes.py) and its reason as the remark."""
    code = error_code(e)
    log.info("remoting request %d refused: %s (%s)", request.code, e.message[:200], code.name)
    return request.response(int(code), remark=e.message[:MAX_REMARK_CHARS])


def master_only(replication: GroupReplication, what: str) -> None:
    """Queue locks and pops are the master's (its lock table, its in-flight records), as the replication gate
    rules for their gRPC calls: a slave refuses them with NOT_MASTER (answered SERVICE_NOT_AVAILABLE)."""
    if not replication.is_master():
        raise NotMasterError(f"this broker is not its group's master; send {what} to the master (clients find it "
                             "through the name servers)")


def end_request(request: RemotingCommand) -> pb.EndTransactionRequest | None:
    """The gRPC request of the same work; None for "not known yet" (nothing to do)."""
    group = f.text(request, "producerGroup")
    validate_producer_group(group)
    kind = f.int32(request, "commitOrRollback")
    if kind not in (NOT_TYPE, COMMIT_TYPE, ROLLBACK_TYPE):
        raise InvalidArgumentError(f"commitOrRollback {kind} is not 8 (commit), 12 (rollback) or 0 (not known yet)")
    offset = f.int64(request, "commitLogOffset")
    if offset < 0:
        raise InvalidArgumentError(f"commitLogOffset {offset} is negative")
    if kind == NOT_TYPE:
        return None
    return pb.EndTransactionRequest(half_commitlog_offset=offset, commit=kind == COMMIT_TYPE, producer_group=group,
                                    from_check=f.boolean(request, "fromTransactionCheck"))


class EndTransactionProcessor:
    def __init__(self, transactions: TransactionProcessor, access: Access, replication: GroupReplication | None = None
                 ) -> None:
        self.transactions, self.access = transactions, access
        self.replication = replication or GroupReplication(None)

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            end = end_request(request)
            if end is None:
                log.info("transaction of half at %s: producer %s does not know its state yet; it stays open",
                         request.ext_fields.get("commitLogOffset"), context.peer.address)
                return request.response(int(WireCode.SUCCESS))
            with self.access.as_caller(context):
                target = self.replication.before_write("END_TRANSACTION")
                self.transactions.end(end_transaction_of(end))
            self.replication.after_write(target, "END_TRANSACTION")
            return request.response(int(WireCode.SUCCESS))
        except BrokerError as e:
            return refused(request, e)
        except Exception as e:  # noqa: BLE001 - the last line of defence: answered, and the broker serves on
            return failure(request, e)

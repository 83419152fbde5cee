"""A pull stream that follows its queue: the broker answers the next pull without being asked.

Why: a push consumer pulls again as soon as an answer is in, so on a PullStream every message costs the broker a
request besides its answer: a read completed by gRPC's poller, a hand-off to the stream's worker thread, and the
pull handler finding nothing and holding (about 100 us of the broker's CPU a message sent singly, 2026-11-28,
docs/benchmarks.md). Following drops that request; the answer's own costs stay.

The protocol, on PullStream only (PullMessage ignores ``follow``):

* a request with ``follow`` set is served as any pull. When the broker will follow it, the answer says
  ``following``, and the broker then serves ``followed_pull(request, response)`` (the same pull from the answer's
  ``next_begin_offset``, no commit) and answers again, and so on, each answer saying whether another follows;
* the broker follows an answer that found messages, found none matching the filter, or held for at least half its
  suspend time and found nothing; not a refusal, an OFFSET_ILLEGAL, or an early NO_NEW_MSG (the held-pull budget
  used up, or the broker stopping: the client's back-off applies, and the broker does not spin). It stops following
  when the broker stops;
* while a stream follows, the broker reads no request from it. A client that wants another pull than the one
  followed (another offset, filter or size) ends the stream and opens a new one; a request sent into a following
  stream would be read only after the following ends, answered out of turn.

Each followed pull passes through the same checks as a requested one (the auth gate's rights of the stream's user,
the replication gate), so a right revoked while a stream follows refuses the next followed pull, and that refusal
ends the following. A followed pull commits no offset: a following consumer's offsets go in its periodic commits.

Flow: the broker's next answer waits for gRPC to take the one before (HTTP/2 flow control): a consumer that stops
reading holds the broker at the stream's window, a few answers, not the queue.
"""

from __future__ import annotations

from broker.proto import sluice_pb2 as pb

FOLLOWED_STATUSES = frozenset({pb.FOUND, pb.NO_NEW_MSG, pb.NO_MATCHED_MSG})


def followed_pull(request: pb.PullRequest, response: pb.PullResponse) -> pb.PullRequest:
    """The pull the broker serves next on a following stream: ``request`` from the answer's next offset, no commit."""
    nxt = pb.PullRequest()
    nxt.CopyFrom(request)
    nxt.queue_offset = response.next_begin_offset
    nxt.ClearField("commit_offset")
    return nxt


def may_follow(request: pb.PullRequest, response: pb.PullResponse, served_s: float, max_suspend_ms: int) -> bool:
    """Whether the broker follows this answer (module docstring): asked to, a status that continues, and no early
    NO_NEW_MSG (``served_s``: how long the pull took, its hold included; ``max_suspend_ms``: the broker's cap on a
    hold, which may be shorter than the one asked for)."""
    if not request.follow or request.suspend_timeout_ms <= 0 or response.status not in FOLLOWED_STATUSES:
        return False
    hold_ms = min(request.suspend_timeout_ms, max_suspend_ms)
    return response.status != pb.NO_NEW_MSG or served_s * 1000 >= hold_ms / 2


def continues(request: pb.PullRequest, followed: pb.PullRequest) -> bool:
    """Whether ``request`` is the pull a following stream serves next (``followed``), its commit aside: the client
    then reads the broker's next answer instead of sending it."""
    if not request.HasField("commit_offset"):
        return request == followed
    bare = pb.PullRequest()
    bare.CopyFrom(request)
    bare.ClearField("commit_offset")
    return bare == followed

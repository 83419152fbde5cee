"""Errors the connector raises on purpose; part of the project's one hierarchy (``broker.errors.BrokerError``)."""

from __future__ import annotations

from broker.errors import AuthenticationError, BrokerError, InvalidArgumentError, NoPermissionError, ResponseCode


class SourceOptionError(InvalidArgumentError):
    """A ``spark.read(Stream).format("sluice")`` option is missing, unknown or out of range; the text names it."""


class DataLossError(BrokerError):
    """Messages the query still had to read are gone (expired files, deleted queue) and failOnDataLoss=true."""

    code = ResponseCode.PULL_OFFSET_MOVED


class BrokerGoneError(DataLossError):
    """A broker whose queues the query reads left the cluster (no name server lists it) or does not answer, and
    failOnDataLoss=true: its messages cannot be read, so the query stops rather than go on without them."""


class CredentialsRefusedError(AuthenticationError):
    """A broker refused the query's calls as unauthenticated: no options 'accessKey'/'secretKey', or wrong ones."""


class RightsMissingError(NoPermissionError):
    """A broker refused the query's user a right the query needs; the text names the right and what to grant."""

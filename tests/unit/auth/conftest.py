"""Shared by the authentication tests: the test certificates (tests/support/certs.py) for the tests that sign calls
over TLS, and a SparkSession for the connector's credentials."""

from tests.support.certs import pki
from tests.support.spark import spark

__all__ = ["pki", "spark"]

"""Helpers shared by every test suite: waiting for a condition, brokers, clusters and certificates.

Imported as ``tests.support.<module>`` (pytest puts the project root on ``sys.path``); the suites' own helper modules
next to their tests stay importable by their bare names.
"""

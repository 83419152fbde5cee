"""The gRPC wire API (``sluice.proto``) and its generated stubs; regenerate with ``make proto``."""

"""Runnable Spark pipelines on Sluice: ``python -m streaming_jobs.NAME --help``."""

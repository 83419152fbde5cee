"""The broker process: gRPC service over a MessageStore, consumer offsets, topics, long polling, metrics."""

"""horde_core: process plumbing shared by every Horde Chat service.

Settings (:mod:`horde_core.settings`), JSON logging, Prometheus metrics, the Horde error envelope and
app factory and service skeleton (:mod:`horde_core.app`), gRPC helpers, Redis clients and every Redis key
(:mod:`horde_core.redis_keys`), the completion signal (:mod:`horde_core.signals`), the queue announcement
(:mod:`horde_core.queue_announce`) and the progress-stream wire format (:mod:`horde_core.chat_stream`).
"""

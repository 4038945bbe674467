"""horde_core: process plumbing shared by every Horde Chat service.

Settings (:mod:`horde_core.settings`), JSON logging, Prometheus metrics, the Horde error envelope and
app factory (:mod:`horde_core.app`), gRPC helpers, Redis clients and the completion signal
(:mod:`horde_core.redis_keys`), and the progress-stream wire format (:mod:`horde_core.chat_stream`).
"""

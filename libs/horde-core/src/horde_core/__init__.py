"""horde_core: process plumbing shared by every Horde Chat service.

Settings (:mod:`horde_core.settings`), JSON logging, Prometheus metrics, the Horde error envelope and
app factory (:mod:`horde_core.app`), gRPC helpers, Redis keys and the completion signal.
"""

"""horde_oai: the OpenAI-compatible chat front (``python -m horde_oai``, HTTP 7002).

``POST /v1/chat/completions`` and ``GET /v1/models`` over the native chat routes of admission, reached over
HTTP as a public horde would be, with Redis pub/sub for completion signals. Spec: chat-front.md.
Modules: ``schema`` (screening and validation), ``mapping`` (pure request/response/error mapping),
``completions`` and ``models`` (routes), ``waiter`` and ``signals`` (waiting), ``streaming`` (SSE),
``cancels`` (native cancels with retries), ``openapi``, ``metrics``, ``settings``, ``app``.
"""

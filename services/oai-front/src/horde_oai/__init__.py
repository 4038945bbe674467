"""horde_oai: the OpenAI-compatible chat front (``python -m horde_oai``, HTTP 7002).

``POST /v1/chat/completions`` and ``GET /v1/models`` over the native chat routes of admission, reached over
HTTP as a public horde would be, with Redis pub/sub for completion signals. See docs/openai-front.md.
Modules: ``schema`` (screening and validation), ``native_request``, ``completion`` and ``native_errors``
(pure request, response and error mapping), ``completions`` and ``models`` (routes), ``waiter``,
``wait_rules`` and ``signals`` (waiting), ``streaming`` (SSE),
``cancels`` (native cancels with retries), ``openapi``, ``metrics``, ``settings``, ``app``.
"""

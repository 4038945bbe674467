"""How a gRPC server interceptor wraps a method: one helper, imported by every interceptor of horde_core
(the store-outage and served-counter interceptors, the request-id interceptor). A module of its own because
the interceptors' modules import each other's dependencies (the app factory imports the request-id module)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc


def rewrap_unary(
    handler: grpc.RpcMethodHandler[Any, Any], behavior: Callable[..., Any]
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with its unary-unary behaviour replaced by ``behavior`` (same (de)serializers)."""
    return grpc.unary_unary_rpc_method_handler(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )

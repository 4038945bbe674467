"""The request bodies of submit's routes, read by horde_core's one body reader within each route's bounds
(bounded parsing): ``text/submit`` within SUBMIT_BODY_LIMITS (8 MiB, the largest legal reply),
``text/progress`` within PROGRESS_BODY_LIMITS (2 MiB). NUL is kept: submit replaces it in every stored
string (docs/native-api.md#submit), and progress relays it as the submit stores it.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from horde_contract import RC, HordeError
from horde_core import body as body_reader


def _invalid(message: str) -> HordeError:
    return HordeError(400, RC.BadRequest, f"Input payload validation failed: {message}")


async def read_submit_body(
    request: Request,
    limits: body_reader.BodyLimits,
    read_timeout: float,
    *,
    too_large: HordeError | None = None,
) -> Any:
    """The route's JSON body within ``limits``.

    Errors: 413 ``too_large`` (RequestTooLarge "The request body is larger than N bytes." by default) past its
    bytes, declared or read; 408 RequestBodyTimeout past ``read_timeout`` seconds; 400 BadRequest "Input payload
    validation failed: ..." for a malformed Content-Length, past its elements or depth ("body: The JSON body
    nests deeper than 64 levels."), for invalid JSON, NaN, Infinity or a lone surrogate.
    """
    try:
        return await body_reader.read_json_body(request, limits, read_timeout, refuse_nul=False)
    except body_reader.BodyTooLarge as exc:
        raise (too_large or HordeError(413, RC.RequestTooLarge, str(exc))) from None
    except body_reader.BodyReadTimeout as exc:
        raise HordeError(408, RC.RequestBodyTimeout, str(exc)) from None
    except body_reader.InvalidContentLength as exc:
        raise _invalid(str(exc)) from None
    except body_reader.JsonStructureError as exc:
        raise _invalid(f"body: {exc.message}") from None
    except HordeError as exc:
        raise _invalid(f"body: {exc.message}") from None

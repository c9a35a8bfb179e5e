"""Body codecs of the read API: msgpack or JSON in (by Content-Type), msgpack or JSON out (by Accept).

msgpack carries bytes natively; JSON carries them as base64 strings. The only bytes in a response are
the `b` of opaque values, so a JSON client knows which strings to decode.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson
import ormsgpack
from fastapi import Request, Response
from pydantic import BaseModel, ValidationError

from graphledger.wire import JSON, MSGPACK
from graphledger_server.api.errors import ApiError

_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack")
ModelT = TypeVar("ModelT", bound=BaseModel)


def wants_msgpack(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return any(media in accept for media in _MSGPACK_TYPES)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def respond(
    request: Request,
    body: Any,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    *,
    max_bytes: int | None = None,
) -> Response:
    """`body` as msgpack if the request accepts it, else as JSON; `Vary: Accept` for caches. An
    answer over `max_bytes` is a 413 instead (`GRAPHLEDGER_API_MAX_RESPONSE_BYTES`)."""
    headers = {"Vary": "Accept", **(headers or {})}
    if wants_msgpack(request):
        content, media = ormsgpack.packb(body), MSGPACK
    else:
        content, media = orjson.dumps(body, default=_json_default), JSON
    if max_bytes is not None and len(content) > max_bytes:
        raise ApiError(
            413,
            "response_too_large",
            f"the answer is {len(content)} bytes, over the read API's {max_bytes} "
            "(GRAPHLEDGER_API_MAX_RESPONSE_BYTES); ask for less (a smaller limit, fewer ops)",
        )
    return Response(content, status_code, headers, media_type=media)


async def decode(request: Request, model: type[ModelT], max_bytes: int) -> ModelT:
    """Parse and validate a request body of at most `max_bytes`; 413 beyond, 400 for an undecodable
    body, 422 naming each bad field."""
    media = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
    loads: Callable[[bytes], Any]
    if media in _MSGPACK_TYPES:
        loads = ormsgpack.unpackb
    elif media == JSON or media.endswith("+json"):
        loads = orjson.loads
    else:
        raise ApiError(415, "unsupported_media_type", f"Content-Type {media!r}: send {JSON} or {MSGPACK}")
    too_large = ApiError(
        413, "body_too_large", f"a read request body is at most {max_bytes} bytes (GRAPHLEDGER_API_MAX_BODY_BYTES)"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large  # refused before reading any of it
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_bytes:
            raise too_large
    if not raw:
        raise ApiError(422, "invalid_request", "the request body is empty; send a JSON or msgpack object")
    try:
        data = loads(raw)
    except ValueError as exc:  # both libraries' decode errors are ValueErrors
        raise ApiError(400, "malformed_body", f"the body is not valid {media}: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        raise ApiError(422, "invalid_request", describe(errors)) from None


def describe(errors: Sequence[Any]) -> str:
    """`field: problem; ...` from pydantic's error list: names each field, never echoes the input."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors)

"""`phoenix ingest`'s HTTP server (aiohttp): records into a pipeline's first stage, a record's trace, the OpenAPI
document.

Every /v1/ route answers only a request bearing the token (`Authorization: Bearer`), compared in constant time;
/openapi.json and /healthz hold no data and answer anyone. A request is checked whole before anything is written:
the token, the pipeline, the body (models.py: a list is written all or none of it invalid), each record's size
against the first stage's MAX_MESSAGE_BYTES, then the first stage's backlog against its high water (429 with
Retry-After). Each answer is JSON, errors too (`{"error": ..., "details": [...]}`), and names no secret: a Redis
failure is told as the RedisSpec explains it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import ValidationError
from redis.exceptions import RedisError

from phoenix.cli.ingest.models import ErrorDetail, IngestRecord, IngestRequest, IngestResponse, Written, error_body
from phoenix.cli.ingest.openapi import document
from phoenix.cli.ingest.targets import PipelineUnavailable, Target, Targets, UnknownPipeline
from phoenix.producer import NotReplicated
from phoenix.tools.inspection import DEFAULT_SCAN_LIMIT
from phoenix.tools.trace import trace_record

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TARGETS = web.AppKey("targets", Targets)
OPENAPI = web.AppKey("openapi", str)

RECORDS_PATH = "/v1/pipelines/{name}/records"
RECORD_PATH = "/v1/pipelines/{name}/records/{record_id}"


@dataclass(frozen=True, slots=True)
class ServerOptions:
    token: str
    retry_after_seconds: int  # told with a 429 (and a 503 of Redis)
    max_body_bytes: int


OPTIONS = web.AppKey("options", ServerOptions)


def make_app(targets: Targets, options: ServerOptions) -> web.Application:
    app = web.Application(
        middlewares=[_json_errors, _authenticated(options.token)], client_max_size=options.max_body_bytes
    )
    app[TARGETS], app[OPTIONS] = targets, options
    app[OPENAPI] = json.dumps(document(options.max_body_bytes))
    app.router.add_post(RECORDS_PATH, _post_records)
    app.router.add_get(RECORD_PATH, _get_record)
    app.router.add_get("/openapi.json", _openapi)
    app.router.add_get("/healthz", _healthz)
    app.on_cleanup.append(_close)
    return app


def _error(status: type[web.HTTPException], message: str, **kwargs: Any) -> web.HTTPException:
    return status(text=error_body(message, kwargs.pop("details", None)), content_type="application/json", **kwargs)


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (no such route, a method not allowed, a body over the limit) as JSON too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.content_type == "application/json" or exc.status < 400:
            raise
        text = error_body(exc.reason)
        return web.Response(status=exc.status, text=text, content_type="application/json", headers=_kept(exc))


def _kept(exc: web.HTTPException) -> dict[str, str]:
    return {name: value for name, value in exc.headers.items() if name in ("Allow", "WWW-Authenticate")}


def _authenticated(token: str) -> Any:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                raise _error(web.HTTPUnauthorized, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check


async def _target(request: web.Request) -> Target:
    name = request.match_info["name"]
    try:
        return await request.app[TARGETS].get(name)
    except UnknownPipeline as exc:
        raise _error(web.HTTPNotFound, str(exc)) from None
    except PipelineUnavailable as exc:
        raise _unavailable(request, str(exc)) from None


def _unavailable(request: web.Request, message: str) -> web.HTTPException:
    retry = str(request.app[OPTIONS].retry_after_seconds)
    return _error(web.HTTPServiceUnavailable, message, headers={"Retry-After": retry})


def _redis_failed(request: web.Request, target: Target, exc: RedisError) -> web.HTTPException:
    """503, and the pipeline read again at its next request (a rotated password, a moved service)."""
    request.app[TARGETS].forget(target.pipeline.name)
    return _unavailable(request, f"Redis: {target.pipeline.redis.explain(exc)}")


def _invalid(exc: ValidationError) -> web.HTTPException:
    """422 with each problem's place and message (never the input: it may be large, or someone's data); 400 for a
    body that is no JSON at all."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    if any(error["type"] == "json_invalid" for error in errors):
        return _error(web.HTTPBadRequest, f"the body is not JSON: {errors[0]['msg']}")
    # Without the shape's tag (models.OneOrMany): the place is the record's index, then its field.
    details = [ErrorDetail(loc=list(_untagged(error["loc"])), msg=error["msg"]) for error in errors[:20]]
    return _error(web.HTTPUnprocessableEntity, "the body is not a record or a list of records", details=details)


def _untagged(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    return loc[1:] if loc[:1] in (("record",), ("list",)) else loc


async def _post_records(request: web.Request) -> web.Response:
    target = await _target(request)
    try:
        records = IngestRequest.model_validate_json(await request.read()).records()
    except ValidationError as exc:
        raise _invalid(exc) from None
    first = target.pipeline.first
    _check_sizes(records, first.max_message_bytes)
    if (backlog := await _backlog_over(request, target)) is not None:
        raise _error(
            web.HTTPTooManyRequests,
            f"stage {first.service_name}'s input holds {backlog} unfinished entries, at or over its high water "
            f"{target.gate.high_water}: try again later",
            headers={"Retry-After": str(request.app[OPTIONS].retry_after_seconds)},
        )
    window = request.app[TARGETS].dedup_seconds(target)
    try:
        sent = await target.producer.send_once([record.record() for record in records], window)
    except NotReplicated as exc:
        # Written, not yet on enough replicas: the client's retry finds them (duplicates) once they are.
        raise _unavailable(request, str(exc)) from None
    except RedisError as exc:
        raise _redis_failed(request, target, exc) from None
    target.gate.note_added(sum(s.new for s in sent))
    written = [
        Written(record_id=r.record_id, entry_id=s.entry_id, status="created" if s.new else "duplicate")
        for r, s in zip(records, sent, strict=True)
    ]
    body = IngestResponse(pipeline=target.pipeline.name, stage=first.service_name, records=written)
    status = 201 if any(s.new for s in sent) else 200
    return web.Response(text=body.model_dump_json(), status=status, content_type="application/json")


def _check_sizes(records: list[IngestRecord], limit: int) -> None:
    over = [
        ErrorDetail(loc=[index], msg=f"the record's entry is {size} bytes, over the first stage's {limit}")
        for index, record in enumerate(records)
        if (size := record.entry_bytes()) > limit
    ]
    if over:
        raise _error(web.HTTPUnprocessableEntity, "records over MAX_MESSAGE_BYTES", details=over[:20])


async def _backlog_over(request: web.Request, target: Target) -> int | None:
    try:
        return await target.gate.backlog_over(target.client)
    except RedisError as exc:
        raise _redis_failed(request, target, exc) from None


async def _get_record(request: web.Request) -> web.Response:
    target = await _target(request)
    record_id = request.match_info["record_id"]
    try:
        IngestRecord(record_id=record_id)
    except ValidationError as exc:
        raise _invalid(exc) from None
    try:
        found = await trace_record(
            target.client, target.pipeline.name, list(target.pipeline.stages), record_id, DEFAULT_SCAN_LIMIT
        )
    except RedisError as exc:
        raise _redis_failed(request, target, exc) from None
    return web.json_response(found.as_dict())


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(text=request.app[OPENAPI], content_type="application/json")


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _close(app: web.Application) -> None:
    await app[TARGETS].aclose()

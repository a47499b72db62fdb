"""The OpenAPI 3.1 document of `phoenix ingest`, written once: the paths here, every schema generated from the
pydantic models of models.py (tests/test_ingest.py validates the document, matches its paths with the server's
routes and real answers with its schemas)."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from phoenix.cli.ingest.models import MAX_RECORDS, ErrorResponse, IngestRequest, IngestResponse, TraceResponse

Json = dict[str, Any]
REF = "#/components/schemas/{model}"


def _json(schema: str, description: str, headers: Json | None = None) -> Json:
    response: Json = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": REF.format(model=schema)}}},
    }
    if headers:
        response["headers"] = headers
    return response


def _error(description: str, headers: Json | None = None) -> Json:
    return _json("ErrorResponse", description, headers)


RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer"}}}
NAME = {"name": "name", "in": "path", "required": True, "description": "The pipeline.", "schema": {"type": "string"}}
RECORD_ID = {
    "name": "record_id",
    "in": "path",
    "required": True,
    "description": "The record's id.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 256},
}
UNAUTHORIZED = _error("No token, or not the one the server was given.")
UNKNOWN = _error("No pipeline of this name.")
UNAVAILABLE = _error("Redis, the API server or a replica check failed; a retry is safe.", RETRY_AFTER)


def document(max_body_bytes: int) -> Json:
    _, defs = models_json_schema(
        [
            (IngestRequest, "validation"),
            (IngestResponse, "serialization"),
            (TraceResponse, "serialization"),
            (ErrorResponse, "serialization"),
        ],
        ref_template=REF,
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Phoenix ingest",
            "version": "1",
            "description": 'Records into a pipeline\'s first stage over HTTP (docs/pipelines.md, "HTTP ingest").',
        },
        "components": {
            "schemas": defs["$defs"],
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "paths": {
            "/v1/pipelines/{name}/records": {
                "post": {
                    "operationId": "addRecords",
                    "summary": "Add one record or a list of them to the pipeline's first stage, once per record id.",
                    "description": f"A list holds at most {MAX_RECORDS} records and the body at most {max_body_bytes} "
                    "bytes; an invalid record refuses the whole request, nothing written. A record id added within "
                    "the dedup window is a duplicate: nothing is added, its first entry id is answered.",
                    "security": [{"bearer": []}],
                    "parameters": [NAME],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": REF.format(model="IngestRequest")}}},
                    },
                    "responses": {
                        "201": _json("IngestResponse", "At least one record was added."),
                        "200": _json("IngestResponse", "Every record was a duplicate: nothing added."),
                        "400": _error("The body is not JSON."),
                        "401": UNAUTHORIZED,
                        "404": UNKNOWN,
                        "413": _error(f"The body is over {max_body_bytes} bytes."),
                        "422": _error(
                            "The body is no record or list of records, or a record is over the first "
                            "stage's MAX_MESSAGE_BYTES."
                        ),
                        "429": _error("The first stage's input is over its high water: nothing added.", RETRY_AFTER),
                        "503": UNAVAILABLE,
                    },
                }
            },
            "/v1/pipelines/{name}/records/{record_id}": {
                "get": {
                    "operationId": "traceRecord",
                    "summary": "Where the record is in each stage of the pipeline: `phoenix trace --json`'s view.",
                    "security": [{"bearer": []}],
                    "parameters": [NAME, RECORD_ID],
                    "responses": {
                        "200": _json("TraceResponse", "The record's state in each stage."),
                        "401": UNAUTHORIZED,
                        "404": UNKNOWN,
                        "422": _error("Not a record id."),
                        "503": UNAVAILABLE,
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document.",
                    "responses": {"200": {"description": "The OpenAPI document.", "content": {"application/json": {}}}},
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "health",
                    "summary": "The server answers.",
                    "responses": {"200": {"description": "Serving.", "content": {"application/json": {}}}},
                }
            },
        },
    }

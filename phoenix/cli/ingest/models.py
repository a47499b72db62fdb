"""What `phoenix ingest` accepts and answers, as pydantic models: the body is untrusted, so each field is bounded
(lengths, the data's depth and size) and anything else is refused whole; the OpenAPI document's schemas are
generated from these models (openapi.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    Tag,
    field_validator,
    model_validator,
)

from phoenix.producer import BATCH, Record

# A record id or user id: printable, no whitespace (it becomes part of Redis key names and log lines).
ID_PATTERN = r"^[^\s\x00-\x1f\x7f]+$"
MAX_ID_LENGTH = 256
# A request holds at most one producer batch: one pipeline to Redis.
MAX_RECORDS = BATCH
# Levels of nesting in a record's data: far below what the workers refuse (1,024), and no recursion in the check.
MAX_DATA_DEPTH = 64

RecordId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)]


def _depth(value: Any) -> int:
    """The nesting depth of a JSON value (1 for a flat object), walked without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        todo.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


class IngestRecord(BaseModel):
    """One record for the pipeline's first stage: what `phoenix enqueue --from` reads from a JSON line."""

    model_config = ConfigDict(extra="forbid", strict=True)

    record_id: RecordId = Field(description="The record's id: a retried request with the same id adds nothing.")
    user_id: str = Field(
        default="", max_length=MAX_ID_LENGTH, pattern=r"^[^\s\x00-\x1f\x7f]*$", description="Whose record (billing)."
    )
    data: dict[str, Any] = Field(
        default_factory=dict,
        description=f"The JSON object the stage's processor receives (at most {MAX_DATA_DEPTH} "
        "levels deep, and within the first stage's MAX_MESSAGE_BYTES).",
    )
    deadline: AwareDatetime | Annotated[float, Field(ge=0, lt=1e10)] | None = Field(
        default=None,
        description="When nobody wants the result any more: an ISO 8601 time with its zone, or seconds since the "
        "Unix epoch; past it a stage dead-letters the record as Expired, unprocessed.",
    )

    @field_validator("data")
    @classmethod
    def _bounded_depth(cls, data: dict[str, Any]) -> dict[str, Any]:
        if _depth(data) > MAX_DATA_DEPTH:
            raise ValueError(f"data is nested deeper than {MAX_DATA_DEPTH} levels")
        return data

    @model_validator(mode="after")
    def _an_entry(self) -> IngestRecord:
        self.record().fields()  # what the producer refuses (a deadline past the year 2286) is a 422, not a 500
        return self

    def record(self) -> Record:
        return Record(self.record_id, self.data, self.user_id, deadline=self.deadline)

    def entry_bytes(self) -> int:
        """The size of the stream entry it becomes (its fields and values), to hold against MAX_MESSAGE_BYTES."""
        return sum(len(k.encode()) + len(v.encode()) for k, v in self.record().fields().items())


class IngestBatch(RootModel[list[IngestRecord]]):
    root: list[IngestRecord] = Field(min_length=1, max_length=MAX_RECORDS)


def _shape(body: Any) -> str:
    return "list" if isinstance(body, list) else "record"


# Told apart by the body's shape, so that an error names the records' places, not both readings of the body.
OneOrMany = Annotated[
    Annotated[IngestRecord, Tag("record")] | Annotated[IngestBatch, Tag("list")], Discriminator(_shape)
]


class IngestRequest(RootModel[OneOrMany]):
    """One record, or a list of them (all written, or none when one is invalid)."""

    root: OneOrMany

    def records(self) -> list[IngestRecord]:
        return self.root.root if isinstance(self.root, IngestBatch) else [self.root]


class Written(BaseModel):
    record_id: str
    entry_id: str = Field(description="The stream entry's id: the first one's for a duplicate.")
    status: Literal["created", "duplicate"] = Field(
        description="created: added now; duplicate: this record id was added within the dedup window."
    )


class IngestResponse(BaseModel):
    pipeline: str
    stage: str = Field(description="The first stage, whose input took the records.")
    records: list[Written] = Field(description="One per record, in the request's order.")


class ErrorDetail(BaseModel):
    loc: list[str | int] = Field(description="Where in the body (a record's index, then the field).")
    msg: str


class ErrorResponse(BaseModel):
    error: str
    details: list[ErrorDetail] | None = None


class TraceStage(BaseModel):
    stage: str
    state: str
    text: str
    report: dict[str, Any]


class TraceResponse(BaseModel):
    """`phoenix trace --json`'s view (phoenix/tools/trace.py)."""

    record_id: str
    pipeline: str
    stages: list[TraceStage]
    position: str | None
    now: str


def error_body(message: str, details: list[ErrorDetail] | None = None) -> str:
    return ErrorResponse(error=message, details=details).model_dump_json(exclude_none=True)

"""`phoenix ingest` as a real process on the session's Valkey (its one pipeline given with --stage, no
Kubernetes): records into the first stage's input once per record id, 401 and 404 and 422 before anything is
written, 429 with Retry-After while the input is over the high water, a record's trace; the OpenAPI document is
valid, names every route the server answers, and the real answers match its schemas. Hostile bodies (hypothesis)
never get a 500 and never write part of a batch."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis as sync_redis
from hypothesis import given
from hypothesis import strategies as st
from openapi_spec_validator import validate

from phoenix.cli.ingest.models import MAX_DATA_DEPTH, MAX_RECORDS
from phoenix.cli.ingest.openapi import document
from phoenix.cli.ingest.server import ServerOptions, make_app
from phoenix.cli.ingest.targets import GivenPipeline, IngestOptions, Targets
from phoenix.keys import StageKeys
from phoenix.redis_spec import RedisSpec
from tests.fixtures.eventually import eventually
from tests.fixtures.fuzzing import fuzz_settings
from tests.fixtures.ingest import PHOENIX, Answer, running_ingest
from tests.fixtures.ingest import call as ingest_call
from tests.fixtures.processes import free_loopback_port
from tests.fixtures.replies import read_group_now, stream_entries_now

pytestmark = pytest.mark.subprocess

TOKEN = "ingest-test-token-8d2e41"  # the test's own; it must never show in the server's log
NAMESPACE = "ingest"
FIRST, SECOND = StageKeys.for_stage("router", NAMESPACE), StageKeys.for_stage("parser", NAMESPACE)


@contextmanager
def serving(redis_url: str, workdir: Path, *options: str) -> Iterator[str]:
    """`phoenix ingest` serving the pipeline `docs` (router, then parser) of NAMESPACE; yields its base URL."""
    given = [f"--redis-url={redis_url}", f"--namespace={NAMESPACE}", "--pipeline=docs", "--stage=router"]
    with running_ingest(workdir, TOKEN, *given, "--stage=parser", *options) as base:
        yield base


def call(
    base: str, method: str, path: str, body: Any = None, token: str | None = TOKEN, raw: bytes | None = None
) -> Answer:
    """One request, with the test's token unless told otherwise."""
    return ingest_call(base, method, path, body, token, raw)


@pytest.fixture
def valkey(redis_url: str) -> Iterator[sync_redis.Redis]:
    client = sync_redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def ingest(redis_url: str, valkey: sync_redis.Redis, tmp_path: Path) -> Iterator[str]:
    with serving(redis_url, tmp_path) as base:
        yield base


OPENAPI = document(8 * 1024 * 1024)


def conforms(answer: Answer, path: str, method: str) -> Any:
    """The answer's body validated against the schema the document gives its path, method and status."""
    status, headers, body = answer
    response = OPENAPI["paths"][path][method]["responses"][str(status)]
    schema = response["content"]["application/json"]["schema"]
    jsonschema.validate(body, {**schema, "components": OPENAPI["components"]})
    for header in response.get("headers", {}):
        assert header in headers
    return body


RECORDS, RECORD = "/v1/pipelines/{name}/records", "/v1/pipelines/{name}/records/{record_id}"


def test_a_record_is_added_once_and_a_retry_answers_the_same_entry(ingest: str, valkey: sync_redis.Redis) -> None:
    record = {
        "record_id": "doc-1",
        "user_id": "u-1",
        "data": {"url": "s3://b/doc-1.pdf"},
        "deadline": "2099-01-01T00:00:00Z",
    }
    first = conforms(call(ingest, "POST", "/v1/pipelines/docs/records", record), RECORDS, "post")
    assert first["pipeline"] == "docs" and first["stage"] == "router"
    ((written),) = first["records"]
    assert written["record_id"] == "doc-1" and written["status"] == "created"
    status, _, again = call(ingest, "POST", "/v1/pipelines/docs/records", record)
    assert status == 200 and again["records"] == [{**written, "status": "duplicate"}]
    entries = stream_entries_now(valkey, FIRST.input)
    assert [entry_id for entry_id, _ in entries] == [written["entry_id"]]
    fields = entries[0][1]
    assert fields["record_id"] == "doc-1" and fields["user_id"] == "u-1"
    assert json.loads(fields["data"]) == {"url": "s3://b/doc-1.pdf"}
    assert fields["deadline"] == "4070908800000" and "entered_at" in fields
    # The marker's window is the first stage's IDEMPOTENCY_TTL (a day by default).
    assert 86_000 < valkey.ttl(FIRST.ingest_marker(FIRST.input, "doc-1")) <= 86_400


def test_a_list_is_written_in_order_with_duplicates_told_apart(ingest: str, valkey: sync_redis.Redis) -> None:
    call(ingest, "POST", "/v1/pipelines/docs/records", {"record_id": "a"})
    batch = [{"record_id": r, "data": {"i": i}} for i, r in enumerate(["b", "a", "c", "b"])]
    first = conforms(call(ingest, "POST", "/v1/pipelines/docs/records", batch), RECORDS, "post")
    assert [w["status"] for w in first["records"]] == ["created", "duplicate", "created", "duplicate"]
    assert first["records"][3]["entry_id"] == first["records"][0]["entry_id"]
    answer = call(ingest, "POST", "/v1/pipelines/docs/records", [{"record_id": "d"}, *batch])
    body = conforms(answer, RECORDS, "post")
    assert answer[0] == 201
    assert [(w["record_id"], w["status"]) for w in body["records"]] == [
        ("d", "created"),
        ("b", "duplicate"),
        ("a", "duplicate"),
        ("c", "duplicate"),
        ("b", "duplicate"),
    ]
    assert [f["record_id"] for _, f in stream_entries_now(valkey, FIRST.input)] == ["a", "b", "c", "d"]


def test_refusals_write_nothing_and_say_why(ingest: str, valkey: sync_redis.Redis) -> None:
    post = "/v1/pipelines/docs/records"
    for token in (None, "wrong-token", TOKEN + "x"):
        answer = call(ingest, "POST", post, {"record_id": "x"}, token=token)
        assert answer[0] == 401 and answer[1]["WWW-Authenticate"] == "Bearer"
        conforms(answer, RECORDS, "post")
    assert call(ingest, "GET", "/v1/pipelines/docs/records/x", token=None)[0] == 401
    unknown = conforms(call(ingest, "POST", "/v1/pipelines/nope/records", {"record_id": "x"}), RECORDS, "post")
    assert "no pipeline 'nope'" in unknown["error"]
    assert call(ingest, "GET", "/v1/pipelines/nope/records/x")[0] == 404
    not_json = call(ingest, "POST", post, raw=b'{"record_id": ')
    assert not_json[0] == 400 and "not JSON" in conforms(not_json, RECORDS, "post")["error"]
    one_bad = [{"record_id": "ok-1"}, {"record_id": "ok-2", "data": [1]}, {"record_id": "has space"}]
    answer = call(ingest, "POST", post, one_bad)
    assert answer[0] == 422
    details = conforms(answer, RECORDS, "post")["details"]
    assert {tuple(d["loc"][:2]) for d in details} >= {(1, "data"), (2, "record_id")}
    deep: Any = {}
    for _ in range(MAX_DATA_DEPTH + 1):
        deep = {"x": deep}
    assert "deeper than" in call(ingest, "POST", post, {"record_id": "deep", "data": deep})[2]["details"][0]["msg"]
    too_many = [{"record_id": f"r{i}"} for i in range(MAX_RECORDS + 1)]
    assert call(ingest, "POST", post, too_many)[0] == 422
    assert call(ingest, "POST", post, {"record_id": "x", "extra": 1})[0] == 422
    assert call(ingest, "POST", post, {"record_id": "x", "deadline": "2030-01-01T00:00:00"})[0] == 422  # no zone
    assert call(ingest, "POST", post, {"record_id": "x", "deadline": "2300-01-01T00:00:00Z"})[0] == 422  # no time
    big = {"record_id": "big", "data": {"text": "x" * 1_100_000}}  # over the first stage's MAX_MESSAGE_BYTES
    answer = call(ingest, "POST", post, big)
    assert answer[0] == 422 and "MAX_MESSAGE_BYTES" in conforms(answer, RECORDS, "post")["error"]
    assert valkey.exists(FIRST.input) == 0 and valkey.keys("*ingested*") == []
    # A body over --max-body-bytes (8 MiB): aiohttp's refusal, as JSON too.
    huge = call(ingest, "POST", post, raw=b'{"record_id": "h", "data": {"t": "' + b"x" * (9 * 1024 * 1024) + b'"}}')
    assert huge[0] == 413 and conforms(huge, RECORDS, "post")["error"]


def test_over_the_high_water_answers_429_until_the_stage_catches_up(
    redis_url: str, valkey: sync_redis.Redis, tmp_path: Path
) -> None:
    with serving(redis_url, tmp_path, "--high-water=5", "--retry-after=3") as base:
        post = "/v1/pipelines/docs/records"
        assert call(base, "POST", post, [{"record_id": f"r{i}"} for i in range(5)])[0] == 201
        answer = call(base, "POST", post, {"record_id": "late"})
        assert answer[0] == 429 and answer[1]["Retry-After"] == "3"
        assert "holds 5 unfinished entries" in conforms(answer, RECORDS, "post")["error"]
        assert valkey.xlen(FIRST.input) == 5
        # The first stage reads and acknowledges: once measured again, the input is below the mark.
        valkey.xgroup_create(FIRST.input, FIRST.consumer_group, "0")
        read = read_group_now(valkey, FIRST.consumer_group, "w1", FIRST.input, 10)
        valkey.xack(FIRST.input, FIRST.consumer_group, *[entry_id for entry_id, _ in read])
        eventually(lambda: call(base, "POST", post, {"record_id": "late"})[0] == 201, "accepted again", 10)
        assert valkey.xlen(FIRST.input) == 6


def test_a_record_s_trace_is_phoenix_trace_s_view(ingest: str, valkey: sync_redis.Redis) -> None:
    call(ingest, "POST", "/v1/pipelines/docs/records", {"record_id": "t-1", "data": {"k": "v"}})
    answer = call(ingest, "GET", "/v1/pipelines/docs/records/t-1")
    body = conforms(answer, RECORD, "get")
    assert body["record_id"] == "t-1" and body["pipeline"] == "docs"
    assert [(s["stage"], s["state"]) for s in body["stages"]] == [("router", "waiting"), ("parser", "not seen")]
    assert body["position"] == "router" and body["now"].startswith("router: waiting since")
    unseen = conforms(call(ingest, "GET", "/v1/pipelines/docs/records/never"), RECORD, "get")
    assert unseen["position"] is None
    assert call(ingest, "GET", "/v1/pipelines/docs/records/%20x")[0] == 422


def test_the_openapi_document_is_valid_and_names_every_route_the_server_answers(ingest: str) -> None:
    served = call(ingest, "GET", "/openapi.json", token=None)
    assert served[0] == 200 and served[2] == OPENAPI
    validate(OPENAPI)
    targets = Targets(
        GivenPipeline("docs", ["router"], NAMESPACE, RedisSpec.from_url("redis://127.0.0.1:1")),
        IngestOptions(None, None, 1.0),
    )
    app = make_app(targets, ServerOptions(TOKEN, 1, 1024))
    routes = {
        (resource.canonical, route.method.lower())
        for resource in app.router.resources()
        for route in resource
        if route.method != "HEAD"
    }
    documented = {(path, method) for path, methods in OPENAPI["paths"].items() for method in methods}
    assert routes == documented


# -- hostile bodies ---------------------------------------------------------------------------------------------


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    _nested,
    max_leaves=20,
)
_ids = st.text(min_size=0, max_size=12) | st.sampled_from(["a", "b", "ok", "x y", "\x00", "é", "a" * 300])
_records = st.fixed_dictionaries(
    {"record_id": _ids | _json_values},
    optional={
        "user_id": _ids | _json_values,
        "data": st.dictionaries(st.text(max_size=8), _json_values, max_size=4) | _json_values,
        "deadline": st.floats(allow_nan=True, allow_infinity=True)
        | st.sampled_from(["2030-01-01T00:00:00Z", "2300-01-01T00:00:00Z", "2030-01-01", "soon", -1, 1e12])
        | _json_values,
        "extra": _json_values,
    },
)
_bodies = _records | st.lists(_records, max_size=6) | _json_values


def _hostile(base: str, valkey: sync_redis.Redis) -> Callable[[Any], None]:
    def check(body: Any) -> None:
        before = valkey.xlen(FIRST.input)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, _, answer = call(base, "POST", "/v1/pipelines/docs/records", raw=raw)
        added = valkey.xlen(FIRST.input) - before
        assert status in (200, 201, 400, 422), (status, answer)
        if status in (200, 201):
            sent = body if isinstance(body, list) else [body]
            assert len(answer["records"]) == len(sent)
            assert added == sum(w["status"] == "created" for w in answer["records"])
        else:
            assert added == 0, "a refused body wrote entries"
            assert answer["error"]

    return check


@pytest.mark.fuzz
@pytest.mark.timeout(180)
def test_hostile_bodies_never_get_a_500_or_a_partial_write(ingest: str, valkey: sync_redis.Redis) -> None:
    check = _hostile(ingest, valkey)

    @fuzz_settings(200)
    @given(_bodies | st.binary(max_size=40))
    def bodies(body: Any) -> None:
        check(body)

    bodies()


def test_a_redis_that_does_not_answer_is_a_503_naming_no_password(tmp_path: Path) -> None:
    nobody = f"redis://:pw-s3cret-77@127.0.0.1:{free_loopback_port()}/0"
    with serving(nobody, tmp_path) as base:
        for method, path, body in (
            ("POST", "/v1/pipelines/docs/records", {"record_id": "a"}),
            ("GET", "/v1/pipelines/docs/records/a", None),
        ):
            status, headers, answer = call(base, method, path, body)
            assert status == 503 and headers["Retry-After"] == "5", answer
            assert answer["error"].startswith("Redis: ") and "pw-s3cret-77" not in json.dumps(answer)
    assert not [log for log in tmp_path.glob("ingest-*.log") if "pw-s3cret-77" in log.read_text()]


def test_an_api_server_that_does_not_answer_is_a_503(tmp_path: Path) -> None:
    """The pipelines from the API server (no --stage), which nothing serves: a 503, the server goes on."""
    kubeconfig = tmp_path / "kubeconfig"
    server = f"https://127.0.0.1:{free_loopback_port()}"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": "kube-t0ken-x"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    with running_ingest(tmp_path, TOKEN, f"--kubeconfig={kubeconfig}", "--namespace=team") as base:
        status, headers, answer = call(base, "POST", "/v1/pipelines/docs/records", {"record_id": "a"})
        assert status == 503 and "Retry-After" in headers and answer["error"].startswith("the API server"), answer
        assert "kube-t0ken-x" not in json.dumps(answer)


def test_bad_options_are_one_line_and_exit_2_with_nothing_listening(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    refusals = {
        f"--token-file={tmp_path / 'none'} --stage=a --pipeline=p": "cannot read --token-file",
        f"--token-file={empty} --stage=a --pipeline=p": "holds no token",
        f"--token-file={token} --stage=a": "--stage needs --pipeline",
        f"--token-file={token} --pipeline=p --stage=a --high-water=-1": "not a whole number",
    }
    for options, message in refusals.items():
        done = subprocess.run(
            [PHOENIX, "ingest", f"--port={free_loopback_port()}", *options.split()],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and message in done.stderr, (options, done.stderr)
        assert TOKEN not in done.stderr

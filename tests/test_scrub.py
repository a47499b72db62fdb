"""Masking known secrets out of error strings: the forms a value takes, and whose keys a task masks."""

from __future__ import annotations

import asyncio
import json
import secrets

from phoenix.redis_spec import RedisSpec
from phoenix.worker_runtime import scrub


def test_registered_values_are_masked_in_every_form_a_log_line_gives_them() -> None:
    password = f'p"{secrets.token_hex(6)}\\'
    scrub.register(password, None, "")

    line = f"error={password} json={json.dumps(password)} repr={password!r}"

    assert scrub.scrub(line) == "error=*** json=\"***\" repr='***'"


def test_the_url_password_is_masked_as_written_and_decoded() -> None:
    token = secrets.token_hex(6)
    scrub.register(*RedisSpec.from_url(f"redis://app:{token}%2Fx@redis:6379/0").secrets())

    assert (
        scrub.scrub(f"AUTH {token}/x failed for redis://app:{token}%2Fx@redis")
        == "AUTH *** failed for redis://app:***@redis"
    )


def test_a_value_containing_another_is_masked_whole() -> None:
    inner = secrets.token_hex(4)
    scrub.register(inner, f"{inner}-outer")

    assert scrub.scrub(f"{inner}-outer {inner}") == "*** ***"


def test_a_short_value_is_masked_as_a_whole_token_only() -> None:
    # Unique to this test: a registered value stays masked for the rest of the process.
    pin, word = str(secrets.randbelow(9000) + 1000), f"q{secrets.token_hex(1)}"
    scrub.register(pin, word)

    quoted = f"PIN={pin} AUTH {word} failed: redis://u:{word}@h '{pin}' [{pin}] {json.dumps(pin)}"
    assert scrub.scrub(quoted) == "PIN=*** AUTH *** failed: redis://u:***@h '***' [***] \"***\""
    inside = f"id 17{pin}89-0 at 2026-12-02T08:{pin}Z x{word} {word}y {word}_z"
    assert scrub.scrub(inside) is inside


def test_a_url_s_user_info_is_masked() -> None:
    text = "must be http(s) (got 'ftp://alice:s3cr%40t@billing:4000/x', and https://token@h, not http://h/a@b)"
    assert scrub.without_user_info(text) == (
        "must be http(s) (got 'ftp://***@billing:4000/x', and https://***@h, not http://h/a@b)"
    )


async def test_exposed_keys_are_masked_in_their_task_and_its_threads_only() -> None:
    mine, theirs = f"sk-{secrets.token_hex(8)}", f"sk-{secrets.token_hex(8)}"
    both_exposed = asyncio.Barrier(2)

    async def message(key: str) -> tuple[str, str]:
        scrub.expose(key)
        await both_exposed.wait()
        text = f"{mine} {theirs}"
        return scrub.scrub(text), await asyncio.to_thread(scrub.scrub, text)

    seen = await asyncio.gather(message(mine), message(theirs))

    assert seen == [(f"*** {theirs}",) * 2, (f"{mine} ***",) * 2]
    assert scrub.scrub(mine) == mine  # nothing left behind outside the tasks


def test_text_without_secrets_is_returned_as_is() -> None:
    text = "ConnectionError: redis:6379 refused"
    assert scrub.scrub(text) is text

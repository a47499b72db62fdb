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


def test_a_value_containing_another_is_masked_whole_and_short_values_not_at_all() -> None:
    inner = secrets.token_hex(4)
    scrub.register(inner, f"{inner}-outer", "abc")

    assert scrub.scrub(f"{inner}-outer {inner} abc") == "*** *** abc"


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

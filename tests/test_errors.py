"""One error tree: every exception class Phoenix defines derives from phoenix.errors.PhoenixError, so that a caller
catches one thing; the example stages (a team's library, phoenix.stages) raise their own."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import phoenix
from phoenix.errors import ConfigError, PhoenixError, StartRefused
from phoenix.redis_spec import RedisSpecError
from phoenix.worker_runtime.lanes import OutputLayoutDiffers
from phoenix.worker_runtime.ownership import KeyOfAnotherType, KeysHeld, LayoutDiffers
from phoenix.worker_runtime.processor import ProcessorLoadError
from phoenix.worker_runtime.relay import UnmarkableTarget
from phoenix.worker_runtime.tracing import TracingConfigError


def _phoenix_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(phoenix.__path__, "phoenix."):
        if info.name.startswith("phoenix.stages") or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                found.append(value)
    return found


def test_every_exception_of_phoenix_is_a_phoenix_error() -> None:
    found = _phoenix_exceptions()
    assert len(found) > 20  # the walk found the tree, not nothing
    assert [cls.__qualname__ for cls in found if not issubclass(cls, PhoenixError)] == []


def test_the_worker_catches_one_class_of_each_kind() -> None:
    assert all(issubclass(c, ConfigError) for c in (RedisSpecError, ProcessorLoadError, TracingConfigError))
    refusals = (KeysHeld, KeyOfAnotherType, LayoutDiffers, OutputLayoutDiffers, UnmarkableTarget)
    assert all(issubclass(c, StartRefused) for c in refusals)
    assert LayoutDiffers("ns/s", 2, 4).worker_line().startswith("refusing to start with PARTITIONS=4: ")
    assert OutputLayoutDiffers("ns/t", 2, 4).worker_line().startswith("refusing to start with OUTPUT_PARTITIONS=4: ")
    assert KeysHeld("ns/a", "in").reason == "KeysHeldByAnotherStage"

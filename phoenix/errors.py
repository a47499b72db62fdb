"""The one tree of errors Phoenix raises, so that a caller catches one thing (dramatiq's model).

- `PhoenixError`: the root; every error class of Phoenix's own derives from it (a processor's library raises its
  own, which the runtime treats as failures of the record).
- `ConfigError`: bad configuration found at start (a variable, a Secret, an OTEL_* setting, a processor that does
  not load): one readable line that names the setting and never echoes a secret's value. The worker exits 2.
- `StartRefused`: the configuration is valid but the keys it names must not be worked on now (another stage holds
  them, a layout in Redis differs): the worker exits 2 with `worker_line()`, the operator shows `reason` as the
  stage's condition.
"""

from __future__ import annotations

from typing import ClassVar


class PhoenixError(Exception):
    """Every error Phoenix raises."""


class ConfigError(PhoenixError):
    """Raised with one readable line that names the offending setting."""


class StartRefused(PhoenixError):
    """A worker (or a stage's reconcile) that must not start on the keys it was given; `reason` is the CamelCase
    condition reason the operator shows."""

    reason: ClassVar[str] = "StartRefused"

    def worker_line(self) -> str:
        """What `phoenix worker` prints before it exits 2."""
        return f"refusing to start: {self}"

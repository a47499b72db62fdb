"""Events on PhoenixStages and PhoenixPipelines: a Normal Event for every action the operator takes, a Warning for
every failure, posted once per cause (a retry that fails the same way posts nothing new; a different cause or a
recovery does).

A cause is the failure's reason under one spec generation: the message's details (a driver's wording of a refused
connection, say) may vary from one retry to the next without anything having changed for the reader.

kopf's own Event posting is off (kopf_settings): it would post one per retry and per handler run.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

import aiohttp
from kubernetes.client.exceptions import ApiException

from phoenix.operator.errors import StageError, api_error
from phoenix.operator.kube.api import KubeApi
from phoenix.operator.record import EventSubject

logger = logging.getLogger(__name__)


def involved_object(record: EventSubject) -> dict[str, Any]:
    body = record.body or {}
    meta = body.get("metadata", {})
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "namespace": record.namespace,
        "name": record.name,
        "uid": meta.get("uid"),
    }


class EventRecorder:
    def __init__(self, kube: KubeApi) -> None:
        self._kube = kube

    async def normal(self, record: EventSubject, reason: str, message: str) -> None:
        await self._post(record, "Normal", reason, message)

    async def warning(self, record: EventSubject, source: str, error: StageError) -> None:
        """A Warning for `error` unless the same one is the last posted for `source` (reconcile, restart, ...)."""
        cause = (error.reason, record.generation)
        if record.warnings.get(source) == cause:
            return
        record.warnings[source] = cause
        await self._post(record, "Warning", error.reason, error.message)

    def reporting(self, record: EventSubject, source: str) -> Reporting:
        """`async with events.reporting(record, source):` around one piece of the stage's work."""
        return Reporting(self, record, source)

    @staticmethod
    def resolved(record: EventSubject, source: str) -> None:
        """`source` works again: its next failure is news, even with a cause seen before."""
        record.warnings.pop(source, None)

    async def _post(self, record: EventSubject, type_: str, reason: str, message: str) -> None:
        logger.info("event %s %s on %s/%s: %s", type_, reason, record.namespace, record.name, message)
        try:
            await self._kube.post_event(involved_object(record), type_, reason, message)
        except (ApiException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            # An Event is a courtesy: the status says the same, so a refused post must not fail the action.
            logger.warning("could not post event %s on %s/%s: %s", reason, record.namespace, record.name, exc)


class Reporting:
    """An API error becomes its StageError; a StageError is posted as a Warning (once per cause) and goes on to the
    caller's retry; success makes the next failure news. A class rather than contextlib.asynccontextmanager,
    which sets __traceback__ on the exception and so cannot pass a StageError (a frozen dataclass) through."""

    def __init__(self, recorder: EventRecorder, record: EventSubject, source: str) -> None:
        self._recorder, self._record, self._source = recorder, record, source

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None:
            self._recorder.resolved(self._record, self._source)
        elif isinstance(exc, ApiException):
            error = api_error(exc)
            await self._recorder.warning(self._record, self._source, error)
            raise error from None
        elif isinstance(exc, StageError):
            await self._recorder.warning(self._record, self._source, exc)
        return False

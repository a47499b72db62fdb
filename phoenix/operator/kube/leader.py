"""Leader election over a coordination.k8s.io/v1 Lease: of several operator replicas, only the holder acts.

kopf's peering pauses every operator while more than one is alive rather than electing one, so a standby does not
run kopf at all: it waits for the Lease, and kopf starts once this replica holds it. The rules are client-go's:
the holder renews every `retry_period`; a candidate takes the Lease once it has seen it unchanged for the Lease's
`leaseDurationSeconds` on its own clock (so node clocks need not agree); a holder that could not renew within
`renew_deadline` (shorter than the duration) exits before anyone else may start. On a clean shutdown the holder
releases the Lease so that a standby takes over at once.

The official client's `kubernetes.leaderelection` implements the same rules in threads on the process-wide default
configuration and cannot release on shutdown; here they run as coroutines on the operator's own API client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from phoenix.errors import ConfigError

logger = logging.getLogger(__name__)

# A standby takes over at most LEASE_DURATION + RETRY_PERIOD seconds after the leader's last renewal.
LEASE_DURATION_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10.0
RETRY_PERIOD_SECONDS = 2.0
# Shorter than the renew deadline: one hung request must not outlast it.
REQUEST_TIMEOUT_SECONDS = 4.0
LEASE_LOST_EXIT_CODE = 1
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

Json = dict[str, Any]


class LeaseConfigError(ConfigError):
    """Leader election cannot start: the Lease's namespace is unknown."""


def lease_namespace(configured: str | None) -> str:
    """The given namespace, else the pod's own (from its ServiceAccount mount)."""
    if configured:
        return configured
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        raise LeaseConfigError(
            "--leader-election needs --lease-namespace (or $POD_NAMESPACE) when not running in a pod"
        ) from None


def candidate_identity() -> str:
    """The pod's name (its hostname) plus a random suffix: two processes on one host are two candidates."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _now() -> str:
    """Now as a Kubernetes MicroTime: RFC 3339 with exactly six fractional digits."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    duration_seconds: int = LEASE_DURATION_SECONDS
    renew_deadline: float = RENEW_DEADLINE_SECONDS
    retry_period: float = RETRY_PERIOD_SECONDS


def lease_config(name: str, namespace: str | None) -> LeaseConfig:
    return LeaseConfig(name, lease_namespace(namespace), candidate_identity())


class LeaseElector:
    """Acquires, renews and releases the operator's leader Lease, as client-go's leader election does."""

    def __init__(self, api_client: client.ApiClient, config: LeaseConfig) -> None:
        self._api = client.CoordinationV1Api(api_client)
        self.config = config
        # The Lease's record as last seen, and when (monotonic) it was last seen to change.
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.holder: str | None = None

    async def _call(self, method: Callable[..., Any], *args: Any) -> Json | None:
        """The Lease as JSON; None on 404 (read) or 409 (someone else wrote first)."""
        try:
            response = await asyncio.to_thread(
                method, *args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_SECONDS
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            raise
        return json.loads(response.data)

    async def _read(self) -> Json | None:
        return await self._call(self._api.read_namespaced_lease, self.config.name, self.config.namespace)

    async def _write(self, lease: Json | None, spec: Json) -> bool:
        """Create the Lease, or replace it at the version read (the API server refuses a stale one)."""
        metadata: Json = {"name": self.config.name, "namespace": self.config.namespace}
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
            return await self._call(self._api.create_namespaced_lease, self.config.namespace, body) is not None
        body = {**lease, "spec": spec}
        body["metadata"] = {**metadata, "resourceVersion": lease["metadata"]["resourceVersion"]}
        written = await self._call(self._api.replace_namespaced_lease, self.config.name, self.config.namespace, body)
        return written is not None

    async def try_acquire_or_renew(self) -> bool:
        """One round of the election: True when this candidate holds the Lease afterwards."""
        lease = await self._read()
        me, now = self.config.identity, _now()
        if lease is None:
            self.holder = None
            taken = await self._write(None, self._spec(now, now, 0))
            self.holder = me if taken else None
            return taken
        spec = lease.get("spec") or {}
        self.holder = spec.get("holderIdentity") or None
        record = (self.holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        duration = int(spec.get("leaseDurationSeconds") or self.config.duration_seconds)
        if self.holder not in (None, me) and time.monotonic() - self._observed_at < duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if self.holder == me:
            new = self._spec(spec.get("acquireTime") or now, now, transitions)
        else:
            new = self._spec(now, now, transitions + 1)
        if not await self._write(lease, new):
            return False
        if self.holder != me:
            logger.info(
                "took over the leader Lease %s/%s from %s",
                self.config.namespace,
                self.config.name,
                self.holder or "nobody",
            )
        self.holder = me
        return True

    def _spec(self, acquired: str, renewed: str, transitions: int) -> Json:
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": self.config.duration_seconds,
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        }

    async def _attempt(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except (ApiException, HTTPError, OSError) as exc:
            # The API server is unreachable or refuses: the next round tries again; the deadline decides.
            logger.warning("leader Lease %s/%s: %s", self.config.namespace, self.config.name, exc)
            return False

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease."""
        logger.info(
            "standing by for the leader Lease %s/%s as %s",
            self.config.namespace,
            self.config.name,
            self.config.identity,
        )
        while not await self._attempt():
            await asyncio.sleep(self.config.retry_period)
        logger.info(
            "leading: this replica holds the Lease %s/%s and starts its handlers",
            self.config.namespace,
            self.config.name,
        )

    async def hold(self) -> None:
        """Renew the Lease until it is lost: another holder, or no renewal within the renew deadline."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.config.retry_period)
            left = self.config.renew_deadline - (time.monotonic() - renewed)
            try:
                # Bounded by the deadline: a hung request must not keep this replica acting past it.
                renewed_now = await asyncio.wait_for(self._attempt(), timeout=max(left, 0.0))
            except TimeoutError:
                renewed_now = False
            if renewed_now:
                renewed = time.monotonic()
            elif self.holder not in (None, self.config.identity):
                logger.error("the leader Lease is now held by %s", self.holder)
                return
            elif time.monotonic() - renewed >= self.config.renew_deadline:
                logger.error("could not renew the leader Lease for %.0f s", time.monotonic() - renewed)
                return

    async def release(self) -> None:
        """Give the Lease up (still held, with a 1 s duration and no holder) so that a standby starts at once."""
        with contextlib.suppress(ApiException, HTTPError, OSError):
            lease = await self._read()
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != self.config.identity:
                return
            released = {**spec, "leaseDurationSeconds": 1, "renewTime": _now()}
            released.pop("holderIdentity")
            if await self._write(lease, released):
                logger.info("released the leader Lease %s/%s", self.config.namespace, self.config.name)


async def lead(
    elector: LeaseElector,
    operate: Callable[[], Coroutine[Any, Any, None]],
    stop: asyncio.Event,
    leading: Callable[[bool], None],
) -> None:
    """Stand by until the Lease is held, then run `operate` while holding it; return once `stop` is set and
    `operate` has ended, the Lease released. `leading` is told when this replica starts and stops leading (the
    operator's leader gauge).

    A lost Lease ends the process at once with exit code 1, as client-go's controllers do: handlers still running, or
    API calls still in flight in threads, must not act once another replica may lead. The pod restarts it as a
    candidate.
    """
    acquiring = asyncio.create_task(elector.acquire())
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if acquiring not in done:
        acquiring.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acquiring
        return
    acquiring.result()
    leading(True)
    working = asyncio.create_task(operate())
    holding = asyncio.create_task(elector.hold())
    await asyncio.wait({working, holding}, return_when=asyncio.FIRST_COMPLETED)
    leading(False)
    if holding.done():
        logger.error("lost the leader Lease: exiting so that only the new leader acts")
        logging.shutdown()
        os._exit(LEASE_LOST_EXIT_CODE)
    holding.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await holding
    await elector.release()
    working.result()

"""The background loop that notices a rotated Secret a stage's pods read (spec.redis's, spec.env's, spec.pod.envFrom's):
one `get` per Secret every SECRET_CHECK_SECONDS (the operator may not list or watch Secrets), and a stage whose Secrets
changed, went or came is marked for the converger's repair, which reconciles it and so rolls its workers
(kube/secrets.py: the resourceVersions in the pod template)."""

from __future__ import annotations

import asyncio
import logging

from kubernetes.client.exceptions import ApiException

from phoenix.operator.context import OperatorContext
from phoenix.operator.kube.secrets import rotated_secrets

logger = logging.getLogger(__name__)
# How often the referenced Secrets are read again for a rotation (one `get` per distinct Secret).
SECRET_CHECK_SECONDS = 10.0


async def check_secrets_once(ctx: OperatorContext) -> int:
    """Mark every stage whose Secrets changed for a reconcile (stage/converge.py's repair); returns how many."""
    marked = 0
    for record in ctx.registry.records():
        if not record.secret_versions:
            continue
        try:
            changed = await rotated_secrets(ctx.kube, record.namespace, record.secret_versions)
        except ApiException as exc:
            logger.warning("Secret check of %s/%s failed: %s %s", record.namespace, record.name, exc.status, exc.reason)
            continue
        for name in changed:
            record.drift[f"Secret {name} changed"] = "Secret"
        if changed:
            marked += 1
            ctx.wake.set()
    return marked


async def check_secrets_forever(ctx: OperatorContext) -> None:
    """Until cancelled: a check every SECRET_CHECK_SECONDS."""
    while True:
        try:
            await check_secrets_once(ctx)
        except Exception:
            logger.exception("Secret check failed")  # the next one retries
        await asyncio.sleep(SECRET_CHECK_SECONDS)

"""The Secrets a stage's pods read at start, as the operator follows them: spec.redis's (the worker's connection),
spec.env's `secretKeyRef` and spec.pod.envFrom's `secretRef`.

The operator may `get` Secrets, never list or watch them. A reconcile gets each Secret once (SecretReads) and
remembers its resourceVersion, which goes into the pod template (builders/deployment.py: a rotated Secret rolls the
workers) and which the Secret check (stage/secret_check.py) compares with a `get` every few seconds. Of an envFrom
Secret it also keeps the key names: each becomes a variable the worker must mask (MASKED_ENV), so a key added by a
rotation reaches MASKED_ENV with the same roll that brings it into the pods. No value leaves this module but the
ones spec.redis's reader asks for (redis/target.py), and those only into the connection spec.
"""

from __future__ import annotations

from typing import Any

from phoenix.crds import PhoenixStageSpec
from phoenix.operator.errors import StageError
from phoenix.operator.kube.api import KubeApi
from phoenix.operator.record import ABSENT, SecretsRead

Json = dict[str, Any]


class SecretReads:
    """The Secrets of one namespace one reconcile reads: each got once, its resourceVersion remembered."""

    def __init__(self, kube: KubeApi, namespace: str) -> None:
        self._kube = kube
        self.namespace = namespace
        self._found: dict[str, Json] = {}
        self._missing: dict[str, StageError] = {}

    async def get(self, name: str) -> Json:
        """The Secret; a missing one is a StageError naming it (as spec.redis's must exist)."""
        if name not in self._found and name not in self._missing:
            try:
                self._found[name] = await self._kube.read_secret(self.namespace, name)
            except StageError as missing:
                self._missing[name] = missing
        if name in self._missing:
            raise self._missing[name]
        return self._found[name]

    async def get_if_exists(self, name: str) -> Json | None:
        """The Secret, or None when there is none (remembered as ABSENT: its creation is a change too)."""
        try:
            return await self.get(name)
        except StageError:
            return None

    @property
    def versions(self) -> tuple[tuple[str, str], ...]:
        found = {name: secret["metadata"]["resourceVersion"] for name, secret in self._found.items()}
        return tuple(sorted({**dict.fromkeys(self._missing, ABSENT), **found}.items()))


async def read_pod_secrets(reads: SecretReads, spec: PhoenixStageSpec) -> SecretsRead:
    """Get the Secrets spec.env and spec.pod.envFrom name (a missing one is the pods' problem, shown on them, not
    the stage's: it is remembered as ABSENT) and return what `reads` read in all, spec.redis's included."""
    keys: dict[str, tuple[str, ...]] = {}
    for var in spec.env:
        if var.secret_key_ref is not None:
            await reads.get_if_exists(var.secret_key_ref.name)
    for source in spec.pod.env_from or ():
        if source.secret_ref is not None:
            found = await reads.get_if_exists(source.secret_ref.name)
            keys[source.secret_ref.name] = tuple(sorted((found or {}).get("data") or {}))
    return SecretsRead(reads.versions, keys)


async def rotated_secrets(kube: KubeApi, namespace: str, versions: tuple[tuple[str, str], ...]) -> list[str]:
    """The Secrets among `versions` that changed, went or came since they were read: one `get` each."""
    changed = []
    for name, version in versions:
        try:
            current = (await kube.read_secret(namespace, name))["metadata"]["resourceVersion"]
        except StageError:
            current = ABSENT  # deleted (a Secret spec.redis names: the reconcile says so in the stage's status)
        if current != version:
            changed.append(name)
    return changed

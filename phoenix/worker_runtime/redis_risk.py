"""Whether the Redis server can lose what it acknowledged: eviction, no persistence, a read-only replica.

The runtime is exactly-once only while Redis keeps what it was given. One check, used by the worker (one log
line at start) and the operator (the RedisRisk condition). Managed services may refuse CONFIG: then the answer
is that it could not be checked, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from phoenix.redis_replies import text
from phoenix.redis_spec import is_cluster

_SETTINGS = ("maxmemory-policy", "appendonly", "appendfsync", "save")


@dataclass(frozen=True, slots=True)
class RedisRisk:
    checked: bool
    problems: tuple[str, ...]  # empty: nothing found that loses data
    settings: str  # what was read, for the log line and the condition message

    @property
    def at_risk(self) -> bool:
        return bool(self.problems) or not self.checked

    def describe(self) -> str:
        if not self.checked:
            return f"Redis settings could not be checked ({self.settings}); see docs/durability.md"
        if self.problems:
            return "; ".join(self.problems) + f" ({self.settings}); see docs/durability.md"
        return self.settings


async def assess_redis(client: Redis) -> RedisRisk:
    """Read maxmemory-policy, persistence and role (CONFIG GET, INFO replication) and name what can lose data;
    on a Redis Cluster, of every primary (each is the only copy its slots are written to)."""
    if not is_cluster(client):
        return await _assess(client, None)
    risks = [(node.name, await _assess(client, node)) for node in client.get_primaries()]  # type: ignore[attr-defined]
    return RedisRisk(
        all(risk.checked for _, risk in risks),
        tuple(f"{name}: {problem}" for name, risk in risks for problem in risk.problems),
        "; ".join(f"{name}: {risk.settings}" for name, risk in risks),
    )


async def _assess(client: Redis, node: object | None) -> RedisRisk:
    """One server's settings: the standalone or Sentinel-named one (node None), or one cluster node."""
    try:
        if node is None:
            pipe = client.pipeline(transaction=False)
            for name in _SETTINGS:
                pipe.config_get(name)
            pipe.info("replication")
            *configs, replication = await pipe.execute()
        else:  # a cluster pipeline refuses keyless commands: one call each, at start only
            configs = [await client.config_get(name, target_nodes=node) for name in _SETTINGS]
            replication = await client.info("replication", target_nodes=node)
    except RedisError as exc:
        return RedisRisk(False, (), f"CONFIG GET or INFO refused: {text(exc)[:200]}")
    config = {text(k): text(v) for reply in configs for k, v in reply.items()}
    role = text(replication.get("role", "unknown"))
    replicas = int(replication.get("connected_slaves", 0) or 0)
    policy = config.get("maxmemory-policy", "unknown")
    aof = config.get("appendonly", "unknown")
    snapshots = config.get("save", "")
    problems = []
    if policy != "noeviction":
        problems.append(
            f"maxmemory-policy is {policy}, not noeviction: under memory pressure Redis deletes "
            "streams, markers and locks"
        )
    if aof != "yes" and not snapshots.strip():
        problems.append("no persistence (appendonly no, no save points): a restart empties every stream")
    if role not in ("master", "primary"):
        problems.append(f"role is {role}: writes go to a replica")
    settings = (
        f"maxmemory-policy={policy}, appendonly={aof}, appendfsync={config.get('appendfsync', 'unknown')}, "
        f"save='{snapshots}', role={role}, replicas={replicas}"
    )
    return RedisRisk(True, tuple(problems), settings)

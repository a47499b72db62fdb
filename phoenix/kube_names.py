"""The operator's labels, annotations, finalizer and worker-pod volumes: every name it reads or writes on Kubernetes
objects.

Keys are spelled here once; each constant is named <WHAT>_LABEL or <WHAT>_ANNOTATION after its role. A bottom module
(like keys.py for Redis), because the CRD models refuse a spec.pod that sets these (crds/pod.py) and the operator,
the CLI and the tests use them.
"""

from __future__ import annotations

PREFIX = "phoenix.io"
# kopf's finalizer, put only on stages with deletionPolicy Delete (handlers.stage_deleted).
FINALIZER = f"{PREFIX}/finalizer"
# kopf's copy of the spec it last handled, on each PhoenixStage (kube/kopf_settings.py).
LAST_HANDLED_KEY = "last-handled-configuration"
LAST_HANDLED_ANNOTATION = f"{PREFIX}/{LAST_HANDLED_KEY}"

# Labels of every child object (Deployment, ScaledObject, TriggerAuthentication) of a stage.
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
STAGE_LABEL = f"{PREFIX}/stage"
# spec.pod.labels may not set these (the Deployment selects its pods by them), nor any other key under PREFIX/.
OPERATOR_LABELS = (NAME_LABEL, INSTANCE_LABEL, MANAGED_BY_LABEL, STAGE_LABEL)
WORKER_APP_NAME = "phoenix-worker"
# The operator's own pods (manifests/operator/deployment.yaml), which `kubectl phoenix report` collects logs of.
OPERATOR_APP_NAME = "phoenix-operator"
MANAGED_BY = "phoenix-operator"

# On a PhoenixStage made by a PhoenixPipeline: the pipeline's name (its ownerReference says which one, by uid).
PIPELINE_LABEL = f"{PREFIX}/pipeline"

# On a PhoenixStage: one-off actions asked for by people (stage/requests.py); on a PhoenixPipeline, passed on to
# each of its stages (operator/pipeline/requests.py).
RESTART_ANNOTATION = f"{PREFIX}/restart"
REPLAY_ANNOTATION = f"{PREFIX}/replay-dlq"
# On the Deployment: the restart value whose rollout it carries, written in the same patch as the rollout.
HANDLED_RESTART_ANNOTATION = f"{PREFIX}/restart-handled"
# On the pod template: changing it rolls the workers.
RESTARTED_AT_ANNOTATION = f"{PREFIX}/restartedAt"
# On the pod template: `name=resourceVersion,...` of every Secret the pods read at start (spec.redis's, spec.env's,
# spec.pod.envFrom's); a rotated Secret rolls the workers. Versions only: anyone who may read a pod may read it.
SECRET_VERSIONS_ANNOTATION = f"{PREFIX}/secret-versions"
# Removed from the pod templates earlier versions wrote: a salted SHA-256 of the Redis Secrets' values, open to an
# offline guess of a weak password by anyone who may read a Deployment.
RETIRED_POD_ANNOTATIONS = (f"{PREFIX}/redis-secrets",)
# On the Deployment: the label and annotation keys spec.pod put on its pod template (JSON), so dropped ones go.
POD_KEYS_ANNOTATION = f"{PREFIX}/pod-keys"
# On the pod template: where Prometheus scrapes the worker. spec.pod.annotations may not set these nor PREFIX/ ones.
SCRAPE_ANNOTATION = "prometheus.io/scrape"
SCRAPE_PORT_ANNOTATION = "prometheus.io/port"
SCRAPE_PATH_ANNOTATION = "prometheus.io/path"
OPERATOR_POD_ANNOTATIONS = (SCRAPE_ANNOTATION, SCRAPE_PORT_ANNOTATION, SCRAPE_PATH_ANNOTATION)
# KEDA's own, on the ScaledObject of a paused stage.
PAUSED_ANNOTATION = "autoscaling.keda.sh/paused"
PAUSED_REPLICAS_ANNOTATION = "autoscaling.keda.sh/paused-replicas"

# The worker pod's own volumes and where the container mounts them: spec.pod.volumes and volumeMounts keep off them.
TMP_VOLUME, TMP_DIR = "tmp", "/tmp"
REDIS_TLS_VOLUME, REDIS_TLS_DIR = "redis-tls", "/etc/phoenix/redis-tls"

# The Secret of each namespace holding the password of its Redis ACL user (operator/redis/acl.py), and when it was
# last replaced and the SHA-256 of the one it replaced (valid until the grace period is over) as its annotations.
REDIS_USER_SECRET = "phoenix-redis-user"
PASSWORD_ROTATED_ANNOTATION = f"{PREFIX}/password-rotated-at"
PREVIOUS_PASSWORD_ANNOTATION = f"{PREFIX}/previous-password-sha256"

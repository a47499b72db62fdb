"""PhoenixStage.spec.pod: how the worker pods are shaped (placement, identity, pull secrets, extra volumes), within
the restricted Pod Security Standard the operator enforces: whatever would give a pod privileges is refused."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from phoenix.crds.common import CamelModel, ObjectName, cel, cel_list
from phoenix.kube_names import (
    OPERATOR_LABELS,
    OPERATOR_POD_ANNOTATIONS,
    PREFIX,
    REDIS_TLS_DIR,
    REDIS_TLS_VOLUME,
    TMP_DIR,
    TMP_VOLUME,
)

# After SHUTDOWN_GRACE the worker cancels the calls still running and waits up to 10 s for them (worker._drain),
# then commits what settled and exits: the kubelet's SIGKILL must come this much after the drain's end.
SHUTDOWN_MARGIN_SECONDS = 15

# A Kubernetes-typed value (affinity, a volume source) handed to the pod as written; the API server checks it when
# the Deployment is created. CEL cannot see inside it, so whatever must be refused is a field of its own.
KubeObject = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "description": "As in a Pod spec; checked by the API server when the Deployment is created.",
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
    ),
]
# A label value (DNS-1123 rules, at most 63 characters; empty allowed).
LabelValue = Annotated[str, Field(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")]
# A label, annotation, node selector or taint key as Kubernetes checks it (a qualified name): a DNS subdomain of at
# most 253 characters and `/` (optional), then a name of at most 63. The prefix's length is a rule of its own
# (_key_cel): a regex cannot count it.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# `[.]`, not `\.`: the pattern goes into CEL string literals too, where `\.` is no escape.
QUALIFIED_NAME_PATTERN = rf"^({_DNS_LABEL}([.]{_DNS_LABEL})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
_PREFIX_MAX = 253
_KEY_RULE = (
    "a qualified name: an optional DNS subdomain of at most 253 characters and '/', then at most 63 letters, "
    "digits, '-', '_' or '.', starting and ending with a letter or digit"
)
# A volume name: a DNS-1123 label.
VolumeName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]


def _own_key(key: str, own: tuple[str, ...]) -> bool:
    return key in own or key.startswith(f"{PREFIX}/")


def is_qualified_name(key: str) -> bool:
    return re.fullmatch(QUALIFIED_NAME_PATTERN, key) is not None and len(key.split("/")[0]) <= _PREFIX_MAX


def _key_cel(key: str) -> str:
    return f"{key}.matches('{QUALIFIED_NAME_PATTERN}') && size({key}.split('/')[0]) <= {_PREFIX_MAX}"


def _qualified_keys(field: str) -> dict[str, Any]:
    """The CEL rule and the message of a map whose keys are labels' (or annotations', or node labels')."""
    return {"rule": f"self.all(k, {_key_cel('k')})", "message": f"every spec.pod.{field} key must be {_KEY_RULE}"}


def _check_keys(field: str, mapping: dict[str, str] | None) -> None:
    if bad := sorted(key for key in mapping or {} if not is_qualified_name(key)):
        raise ValueError(f"every spec.pod.{field} key must be {_KEY_RULE} (got {', '.join(map(repr, bad))})")


_LABELS_MESSAGE = (
    "spec.pod.labels must not set the operator's own labels (" + ", ".join(OPERATOR_LABELS) + f", {PREFIX}/*): "
    "the Deployment selects its pods by them"
)
_ANNOTATIONS_MESSAGE = (
    "spec.pod.annotations must not set the operator's own annotations ("
    + ", ".join(OPERATOR_POD_ANNOTATIONS)
    + f", {PREFIX}/*)"
)
_SECURITY_CONTEXT_MESSAGE = (
    "spec.pod.securityContext is refused: the operator sets the restricted security context itself (non-root, no "
    "privilege escalation, every capability dropped); privileged or root workers are not supported"
)
_HOST_NAMESPACES_MESSAGE = (
    "spec.pod.hostNetwork, hostPID and hostIPC are refused: restricted Pod Security forbids sharing the node's "
    "namespaces"
)
_HOST_PATH_MESSAGE = (
    "spec.pod.volumes: hostPath volumes are refused: they give the pod the node's files, which restricted Pod "
    "Security forbids"
)
# The volume types restricted Pod Security admits (wire names).
VOLUME_SOURCES = (
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "csi",
    "ephemeral",
)
_ONE_SOURCE_MESSAGE = (
    "each spec.pod.volumes entry needs exactly one of " + ", ".join(VOLUME_SOURCES) + " (the volume types "
    "restricted Pod Security admits)"
)
# What a projected volume may gather (wire names): the namespace's Secrets and ConfigMaps and the pod's own fields,
# as its other volumes may, and a ServiceAccount token only when the stage asks for one (allowServiceAccountToken).
# Any other source (clusterTrustBundle, podCertificate, those of later Kubernetes versions) is unknown to the schema.
PROJECTED_SOURCES = ("secret", "configMap", "downwardAPI", "serviceAccountToken")
_ONE_PROJECTION_MESSAGE = "each spec.pod.volumes[].projected.sources entry needs exactly one of " + ", ".join(
    PROJECTED_SOURCES
)
_TOKEN_MESSAGE = (
    "spec.pod.volumes: a projected serviceAccountToken source puts a token of the pods' ServiceAccount in them "
    "(one the Kubernetes API accepts, unless its audience is another): refused unless "
    "spec.pod.allowServiceAccountToken is true"
)
_OWN_VOLUMES = (TMP_VOLUME, REDIS_TLS_VOLUME)
_OWN_VOLUME_MESSAGE = "spec.pod.volumes names " + ", ".join(_OWN_VOLUMES) + " are the operator's own"
_OWN_MOUNTS = (TMP_DIR, REDIS_TLS_DIR)
_OWN_MOUNT_MESSAGE = "spec.pod.volumeMounts must not mount over " + ", ".join(_OWN_MOUNTS) + " (the operator's own)"
_ONE_ENV_SOURCE_MESSAGE = "each spec.pod.envFrom entry needs exactly one of configMapRef or secretRef"
_MOUNT_NEEDS_VOLUME = "every spec.pod.volumeMounts name must be one of spec.pod.volumes"


class LocalObjectReference(CamelModel):
    """An object in the PhoenixStage's namespace, by name."""

    name: ObjectName = Field(description="Name of the object, in the same namespace as the PhoenixStage.")


_TOLERATE_ANY_KEY = "a spec.pod.tolerations entry without a key tolerates every taint: it needs operator Exists"
_EXISTS_HAS_NO_VALUE = "a spec.pod.tolerations entry with operator Exists matches any value: it takes none"
_SECONDS_NEED_NO_EXECUTE = "spec.pod.tolerations[].tolerationSeconds applies to effect NoExecute only: set that effect"


class Toleration(CamelModel):
    """A taint the worker pods tolerate, as in a Pod spec (and checked as a Pod spec's, at admission)."""

    model_config = cel(
        ("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')", _TOLERATE_ANY_KEY),
        (
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            _EXISTS_HAS_NO_VALUE,
        ),
        ("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')", _SECONDS_NEED_NO_EXECUTE),
        (
            f"!has(self.key) || self.key == '' || ({_key_cel('self.key')})",
            f"spec.pod.tolerations[].key must be {_KEY_RULE}",
        ),
    )

    key: str | None = Field(default=None, max_length=317, description="The taint key; empty with Exists: any.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal (default).")
    value: LabelValue | None = Field(default=None, description="The taint value, with Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="The taint effect to match; empty: all."
    )
    toleration_seconds: int | None = Field(
        default=None,
        # Within an int64 (as in a Pod spec), at bounds the API server holds exactly: it keeps them as float64, so
        # 2**63 - 1 would become 2**63 there and refuse itself.
        ge=-(2**53),
        le=2**53,
        description="With NoExecute: how long the pod stays bound after the taint is added.",
    )

    @model_validator(mode="after")
    def _as_kubernetes_checks_it(self) -> Toleration:
        if self.key and not is_qualified_name(self.key):
            raise ValueError(f"spec.pod.tolerations[].key must be {_KEY_RULE} (got {self.key!r})")
        if not self.key and self.operator != "Exists":
            raise ValueError(_TOLERATE_ANY_KEY)
        if self.operator == "Exists" and self.value:
            raise ValueError(_EXISTS_HAS_NO_VALUE)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(_SECONDS_NEED_NO_EXECUTE)
        return self


class EnvSourceRef(CamelModel):
    """A ConfigMap or Secret whose keys become environment variables."""

    name: ObjectName = Field(description="Name of the object, in the same namespace as the PhoenixStage.")
    optional: bool | None = Field(default=None, description="Start the pod even when the object is missing.")


class EnvFromSource(CamelModel):
    """Every key of a ConfigMap or a Secret as environment variables. The operator's own variables (spec.env's
    reserved names) are set in `env`, which Kubernetes gives precedence over `envFrom`."""

    model_config = cel(("has(self.configMapRef) != has(self.secretRef)", _ONE_ENV_SOURCE_MESSAGE))

    prefix: str | None = Field(
        default=None, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Put before every key."
    )
    config_map_ref: EnvSourceRef | None = Field(default=None, description="The ConfigMap to read.")
    secret_ref: EnvSourceRef | None = Field(default=None, description="The Secret to read.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvFromSource:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError(_ONE_ENV_SOURCE_MESSAGE)
        return self


def _exactly_one_cel(names: tuple[str, ...]) -> str:
    return " + ".join(f"(has(self.{name}) ? 1 : 0)" for name in names) + " == 1"


class VolumeProjection(CamelModel):
    """One source of a projected volume, written as in a Pod spec."""

    model_config = cel((_exactly_one_cel(PROJECTED_SOURCES), _ONE_PROJECTION_MESSAGE))

    secret: KubeObject | None = Field(default=None, description="Keys of a Secret of the stage's namespace.")
    config_map: KubeObject | None = Field(default=None, description="Keys of a ConfigMap of the stage's namespace.")
    downward_api: KubeObject | None = Field(
        default=None, alias="downwardAPI", description="The pod's own fields as files."
    )
    service_account_token: KubeObject | None = Field(
        default=None,
        description="A token of the pods' ServiceAccount (workload identity for an audience of your choice): refused "
        "unless spec.pod.allowServiceAccountToken is true.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> VolumeProjection:
        if len(self.to_k8s()) != 1:
            raise ValueError(f"{_ONE_PROJECTION_MESSAGE} (got {', '.join(self.to_k8s()) or 'none'})")
        return self


class ProjectedVolume(CamelModel):
    """Several sources in one directory: Secrets, ConfigMaps, the pod's own fields, and a ServiceAccount token only
    with spec.pod.allowServiceAccountToken."""

    sources: list[VolumeProjection] | None = Field(
        default=None, max_length=32, description="What the volume holds: " + ", ".join(PROJECTED_SOURCES) + "."
    )
    default_mode: int | None = Field(
        default=None, ge=0, le=0o777, description="Mode bits of the files (0 to 0777, as a decimal number)."
    )

    @property
    def has_token(self) -> bool:
        return any(source.service_account_token is not None for source in self.sources or [])


class Volume(CamelModel):
    """An extra volume of the worker pods: one of the types restricted Pod Security admits, written as in a Pod
    spec (`secret: {secretName: models}`). Mount it with spec.pod.volumeMounts."""

    model_config = cel(
        ("!has(self.hostPath)", _HOST_PATH_MESSAGE),
        (_exactly_one_cel(VOLUME_SOURCES), _ONE_SOURCE_MESSAGE),
        (f"!(self.name in {cel_list(_OWN_VOLUMES)})", _OWN_VOLUME_MESSAGE),
    )

    name: VolumeName = Field(description="Volume name, referred to by spec.pod.volumeMounts.")
    config_map: KubeObject | None = Field(default=None, description="A ConfigMap's keys as files.")
    secret: KubeObject | None = Field(default=None, description="A Secret's keys as files.")
    empty_dir: KubeObject | None = Field(default=None, description="A scratch directory living as long as the pod.")
    persistent_volume_claim: KubeObject | None = Field(default=None, description="A PersistentVolumeClaim.")
    projected: ProjectedVolume | None = Field(
        default=None, description="Several sources in one directory (Secrets, ConfigMaps, the pod's fields)."
    )
    downward_api: KubeObject | None = Field(
        default=None, alias="downwardAPI", description="The pod's own fields as files."
    )
    csi: KubeObject | None = Field(default=None, description="An inline CSI volume (a secrets-store driver).")
    ephemeral: KubeObject | None = Field(default=None, description="A generic ephemeral volume.")
    host_path: KubeObject | None = Field(default=None, description="Refused: restricted Pod Security forbids it.")

    @model_validator(mode="after")
    def _admitted(self) -> Volume:
        if self.host_path is not None:
            raise ValueError(_HOST_PATH_MESSAGE)
        sources = [name for name in self.to_k8s() if name in VOLUME_SOURCES]
        if len(sources) != 1:
            raise ValueError(f"{_ONE_SOURCE_MESSAGE} (volume {self.name}: {', '.join(sources) or 'none'})")
        if self.name in _OWN_VOLUMES:
            raise ValueError(_OWN_VOLUME_MESSAGE)
        return self


_CLEAN_MOUNT_PATH = (
    "spec.pod.volumeMounts[].mountPath must be a clean path, without '//', '.' or '..' segments (the container "
    "runtime resolves them: /x/../tmp is /tmp)"
)
_SUB_PATH_DESCENDS = "spec.pod.volumeMounts[].subPath must stay inside its volume: no '..' segment"
_UNIQUE_MOUNT_PATHS = "spec.pod.volumeMounts mount paths must be unique"


def _dot_segments(path: str, dots: tuple[str, ...]) -> bool:
    return any(segment in dots for segment in path.split("/"))


class VolumeMount(CamelModel):
    """Where the worker container mounts one of spec.pod.volumes."""

    model_config = cel(
        (
            " && ".join(f"self.mountPath != '{path}' && !self.mountPath.startsWith('{path}/')" for path in _OWN_MOUNTS),
            _OWN_MOUNT_MESSAGE,
        ),
        (
            "!self.mountPath.contains('//') && !self.mountPath.split('/').exists(s, s == '.' || s == '..')",
            _CLEAN_MOUNT_PATH,
        ),
        ("!has(self.subPath) || !self.subPath.split('/').exists(s, s == '..')", _SUB_PATH_DESCENDS),
    )

    name: VolumeName = Field(description="The volume's name in spec.pod.volumes.")
    mount_path: str = Field(
        min_length=2, max_length=1024, pattern=r"^/[^:]*$", description="Absolute path in the container."
    )
    sub_path: str | None = Field(
        default=None, max_length=1024, pattern=r"^[^/].*$", description="A path inside the volume to mount instead."
    )
    read_only: bool | None = Field(default=None, description="Mount read-only.")

    @model_validator(mode="after")
    def _not_over_own(self) -> VolumeMount:
        # Checked before the operator's paths: "/x/../tmp" is "/tmp" in the container.
        if "//" in self.mount_path or _dot_segments(self.mount_path, (".", "..")):
            raise ValueError(f"{_CLEAN_MOUNT_PATH} (got {self.mount_path!r})")
        if self.sub_path is not None and _dot_segments(self.sub_path, ("..",)):
            raise ValueError(f"{_SUB_PATH_DESCENDS} (got {self.sub_path!r})")
        path = self.mount_path.rstrip("/")
        if any(path == own or path.startswith(f"{own}/") for own in _OWN_MOUNTS):
            raise ValueError(_OWN_MOUNT_MESSAGE)
        return self


class PodSpec(CamelModel):
    """How the worker pods are shaped: placement, identity, pull secrets, extra volumes. The operator keeps the
    restricted security context (non-root, read-only root, no privilege escalation, no capabilities): what would
    relax it is refused at admission."""

    model_config = cel(
        ("!has(self.securityContext)", _SECURITY_CONTEXT_MESSAGE),
        ("!has(self.hostNetwork) && !has(self.hostPID) && !has(self.hostIPC)", _HOST_NAMESPACES_MESSAGE),
        (
            "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
            "self.volumes.exists(v, v.name == m.name))",
            _MOUNT_NEEDS_VOLUME,
        ),
        (
            "!has(self.volumeMounts) || self.volumeMounts.all(m, self.volumeMounts.exists_one(n, "
            "n.mountPath == m.mountPath))",
            _UNIQUE_MOUNT_PATHS,
        ),
        (
            "(has(self.allowServiceAccountToken) && self.allowServiceAccountToken) || !has(self.volumes) || "
            "self.volumes.all(v, !has(v.projected) || !has(v.projected.sources) || "
            "v.projected.sources.all(s, !has(s.serviceAccountToken)))",
            _TOKEN_MESSAGE,
        ),
    )

    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None,
        max_length=16,
        description="Secrets (kubernetes.io/dockerconfigjson) the kubelet pulls spec.image with.",
    )
    service_account_name: ObjectName | None = Field(
        default=None,
        description="The ServiceAccount the pods run as (workload identity for cloud storage). Its API token is "
        "still not mounted: workers talk to Redis only (a projected serviceAccountToken volume needs "
        "allowServiceAccountToken).",
    )
    allow_service_account_token: bool | None = Field(
        default=None,
        description="Admit projected serviceAccountToken sources in spec.pod.volumes: the pods then hold a token "
        "of their ServiceAccount, for the audience the source names (the Kubernetes API's when it names none). "
        "Unset or false: refused, and no token is ever in the pods.",
    )
    node_selector: dict[str, LabelValue] | None = Field(
        default=None,
        max_length=32,
        description="Node labels the pods must be scheduled on.",
        json_schema_extra={"x-kubernetes-validations": [_qualified_keys("nodeSelector")]},
    )
    tolerations: list[Toleration] | None = Field(default=None, max_length=32, description="Taints tolerated.")
    affinity: KubeObject | None = Field(
        default=None,
        description="Node and pod (anti-)affinity, as in a Pod spec; the workers carry the labels "
        "app.kubernetes.io/name=phoenix-worker and app.kubernetes.io/instance=<stage>.",
    )
    topology_spread_constraints: list[KubeObject] | None = Field(
        default=None,
        max_length=8,
        description="How the pods spread over zones or nodes, as in a Pod spec (select them by the labels above).",
    )
    priority_class_name: ObjectName | None = Field(default=None, description="The pods' PriorityClass.")
    labels: dict[str, LabelValue] | None = Field(
        default=None,
        max_length=64,
        description="Extra labels on the pods (cost allocation, mesh). Not the operator's own: "
        + ", ".join(OPERATOR_LABELS)
        + f", {PREFIX}/*.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, !(k in {cel_list(OPERATOR_LABELS)}) && !k.startsWith('{PREFIX}/'))",
                    "message": _LABELS_MESSAGE,
                },
                _qualified_keys("labels"),
            ]
        },
    )
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None,
        max_length=64,
        description="Extra annotations on the pods (service mesh injection, cost allocation). Not the operator's "
        "own: " + ", ".join(OPERATOR_POD_ANNOTATIONS) + f", {PREFIX}/*.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, !(k in {cel_list(OPERATOR_POD_ANNOTATIONS)}) && !k.startsWith('{PREFIX}/'))",
                    "message": _ANNOTATIONS_MESSAGE,
                },
                _qualified_keys("annotations"),
            ]
        },
    )
    env_from: list[EnvFromSource] | None = Field(
        default=None,
        max_length=16,
        description="ConfigMaps and Secrets whose keys become environment variables. The variables the operator "
        "sets win over them (Kubernetes gives `env` precedence).",
    )
    volumes: list[Volume] | None = Field(
        default=None,
        max_length=16,
        description="Extra volumes: " + ", ".join(VOLUME_SOURCES) + " (what restricted Pod Security admits).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    volume_mounts: list[VolumeMount] | None = Field(
        default=None, max_length=16, description="Where the worker container mounts spec.pod.volumes."
    )
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=1,
        le=90_000,
        description="Seconds from SIGTERM to SIGKILL. Default: worker.processingTimeout + "
        f"{SHUTDOWN_MARGIN_SECONDS}, so a record started just before a scale-in or rollout still finishes and "
        f"commits. The worker drains in-flight records for this minus {SHUTDOWN_MARGIN_SECONDS} s "
        "(SHUTDOWN_GRACE).",
    )
    security_context: KubeObject | None = Field(
        default=None, description="Refused: the operator sets the restricted security context itself."
    )
    host_network: bool | None = Field(default=None, description="Refused: restricted Pod Security forbids it.")
    host_pid: bool | None = Field(
        default=None, alias="hostPID", description="Refused: restricted Pod Security forbids it."
    )
    host_ipc: bool | None = Field(
        default=None, alias="hostIPC", description="Refused: restricted Pod Security forbids it."
    )

    @field_validator("node_selector")
    @classmethod
    def _node_label_keys(cls, selector: dict[str, str] | None) -> dict[str, str] | None:
        _check_keys("nodeSelector", selector)
        return selector

    @field_validator("labels")
    @classmethod
    def _not_own_labels(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        _check_keys("labels", labels)
        if clashes := sorted(key for key in labels or {} if _own_key(key, OPERATOR_LABELS)):
            raise ValueError(f"{_LABELS_MESSAGE} (got {', '.join(clashes)})")
        return labels

    @field_validator("annotations")
    @classmethod
    def _not_own_annotations(cls, annotations: dict[str, str] | None) -> dict[str, str] | None:
        _check_keys("annotations", annotations)
        if clashes := sorted(key for key in annotations or {} if _own_key(key, OPERATOR_POD_ANNOTATIONS)):
            raise ValueError(f"{_ANNOTATIONS_MESSAGE} (got {', '.join(clashes)})")
        return annotations

    @model_validator(mode="after")
    def _no_privileges(self) -> PodSpec:
        if self.security_context is not None:
            raise ValueError(_SECURITY_CONTEXT_MESSAGE)
        if self.host_network is not None or self.host_pid is not None or self.host_ipc is not None:
            raise ValueError(_HOST_NAMESPACES_MESSAGE)
        names = [volume.name for volume in self.volumes or []]
        if duplicates := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"spec.pod.volumes names must be unique (repeated: {', '.join(duplicates)})")
        if missing := sorted({mount.name for mount in self.volume_mounts or []} - set(names)):
            raise ValueError(f"{_MOUNT_NEEDS_VOLUME} (got {', '.join(missing)})")
        paths = [mount.mount_path for mount in self.volume_mounts or []]
        if repeated := sorted({path for path in paths if paths.count(path) > 1}):
            raise ValueError(f"{_UNIQUE_MOUNT_PATHS} (repeated: {', '.join(repeated)})")
        tokens = [v.name for v in self.volumes or [] if v.projected is not None and v.projected.has_token]
        if tokens and not self.allow_service_account_token:
            raise ValueError(f"{_TOKEN_MESSAGE} (volume {', '.join(tokens)})")
        return self

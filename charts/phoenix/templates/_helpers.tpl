{{/* Labels of every object: those of manifests/ plus Helm's own two (tests/test_helm_chart.py strips only these). */}}
{{- define "phoenix.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: phoenix
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "phoenix.operatorLabels" -}}
{{ include "phoenix.labels" (dict "name" "phoenix-operator" "root" .) }}
{{- end -}}

{{/* The image by digest when one is given, else by tag (default: the chart's appVersion). */}}
{{- define "phoenix.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The rules of the operator's ClusterRole, or of its Role in each served namespace (without the cluster-scoped
ones): manifests/rbac/cluster-role.yaml and manifests/namespaced/role.yaml. */}}
{{- define "phoenix.namespacedRules" -}}
- apiGroups: ["phoenix.io"]
  resources: ["phoenixstages"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["phoenix.io"]
  resources: ["phoenixstages/status", "phoenixstages/finalizers"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["phoenix.io"]
  resources: ["phoenixpipelines"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["phoenix.io"]
  resources: ["phoenixpipelines/status"]
  verbs: ["patch"]
- apiGroups: ["phoenix.io"]
  resources: ["phoenixpipelines/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects", "triggerauthentications"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# get only: the Secrets a stage's pods read (spec.redis, spec.env, spec.pod.envFrom), read again every 10 s for a
# rotation; never list or watch.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* The worker namespaces the NetworkPolicy covers: networkPolicy.workerNamespaces, else watchNamespaces. */}}
{{- define "phoenix.workerNamespaces" -}}
{{- toJson (.Values.networkPolicy.workerNamespaces | default .Values.watchNamespaces) -}}
{{- end -}}

{{/* One egress rule to peers on TCP ports: (dict "ports" list "to" list). */}}
{{- define "phoenix.egressRule" -}}
- ports:
  {{- range .ports }}
    - {port: {{ . }}, protocol: TCP}
  {{- end }}
  to:
    {{- toYaml .to | nindent 4 }}
{{- end -}}

{{/* Ingress to the metrics port only, from networkPolicy.metricsFrom: (dict "port" int "from" list). */}}
{{- define "phoenix.metricsIngress" -}}
- ports:
    - {port: {{ .port }}, protocol: TCP}
  from:
    {{- toYaml .from | nindent 4 }}
{{- end -}}

{{/* The egress rules every pod gets: each networkPolicy.redis rule, then the cluster DNS (UDP and TCP). */}}
{{- define "phoenix.redisAndDnsEgress" -}}
{{- range .redis -}}
{{ include "phoenix.egressRule" . }}
{{ end -}}
- ports:
  {{- range .dns.ports }}
    - {port: {{ . }}, protocol: UDP}
    - {port: {{ . }}, protocol: TCP}
  {{- end }}
  to:
    {{- toYaml .dns.to | nindent 4 }}
{{- end -}}

{{/* What Redis ACL users add to the operator's rights (manifests/redis-acl/): the Secret phoenix-redis-user of each
stage's namespace; create cannot be limited to a name, update and delete are. */}}
{{- define "phoenix.redisAclRules" -}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: ["phoenix-redis-user"]
  verbs: ["update", "delete"]
{{- end -}}

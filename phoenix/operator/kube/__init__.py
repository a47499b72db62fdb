"""The operator's side of the Kubernetes API: its client (api), Events, the leader Lease, kopf's settings and the
status subresource's patcher."""

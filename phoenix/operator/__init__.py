"""The Phoenix operator: kopf handlers that reconcile PhoenixStages into Deployments and KEDA objects."""

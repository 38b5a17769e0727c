{{/*
The PrometheusRule group of kadmit watch (WATCH-CONTRACT.md, "Alerts";
docs/troubleshooting.md explains each alert and its first response). The
series carry the target's namespace label once scraped; joins and
aggregations keep it, so two releases' watches never make a join ambiguous.
Only the leader exports per-webhook series.
*/}}
{{- define "kadmit.watchRules" -}}
{{- $ns := include "kadmit.namespace" . -}}
- name: kadmit-watch
  rules:
    # The API server rejects every call (x509: certificate has expired)
    # from the moment the leaf an endpoint serves expires.
    - alert: KadmitWebhookCertificateExpiringSoon
      expr: |
        (min by (namespace, configuration, webhook) (kadmit_watch_serving_cert_expiry_timestamp_seconds) - time()) < 7 * 24 * 3600
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: {{ `'webhook {{ $labels.webhook }} ({{ $labels.configuration }}): serving certificate expires in {{ $value | humanizeDuration }}'` }}
        description: {{ `'An endpoint serves a certificate that expires within 7 days; renewal (cert-manager, the component''s own rotation) is failing or the pods did not reload it. Renew it and restart or reload the pods; run "kadmit doctor {{ $labels.configuration }}" (KD406).'` }}
    # Every call fails (x509: certificate signed by unknown authority or
    # expired) once the caBundle's CA expires.
    - alert: KadmitWebhookCABundleExpiringSoon
      expr: |
        (min by (namespace, configuration, webhook) (kadmit_watch_ca_bundle_expiry_timestamp_seconds) - time()) < 7 * 24 * 3600
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: {{ `'webhook {{ $labels.webhook }} ({{ $labels.configuration }}): a CA in its caBundle expires in {{ $value | humanizeDuration }}'` }}
        description: {{ `'Rotate the CA and inject the new one into the caBundle (both CAs during the overlap) before it expires; run "kadmit doctor {{ $labels.configuration }}" (KD403).'` }}
    # failurePolicy Fail with no ready endpoint: every matched request is
    # rejected (no endpoints available for service / connection refused).
    - alert: KadmitFailWebhookNoEndpoints
      expr: |
        kadmit_watch_ready_endpoints * on (namespace, configuration, webhook) group_left kadmit_watch_webhook_info{failure_policy="Fail"} == 0
      for: 1m
      labels:
        severity: critical
      annotations:
        summary: {{ `'Fail webhook {{ $labels.webhook }} ({{ $labels.configuration }}) has no ready endpoint: every matched request is rejected'` }}
        description: {{ `'Find why its pods are not ready (kubectl describe, events of their ReplicaSet: a webhook intercepting its own pods is KD501); run "kadmit doctor {{ $labels.configuration }}" (KD201).'` }}
    # One node drain or crash away from the previous alert.
    - alert: KadmitFailWebhookOneEndpoint
      expr: |
        kadmit_watch_ready_endpoints * on (namespace, configuration, webhook) group_left kadmit_watch_webhook_info{failure_policy="Fail"} == 1
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: {{ `'Fail webhook {{ $labels.webhook }} ({{ $labels.configuration }}) has one ready endpoint'` }}
        description: {{ `'Run at least two replicas on different nodes with a PodDisruptionBudget; run "kadmit doctor {{ $labels.configuration }}" (KD604, KD605).'` }}
    # The Service routes to pods of another workload: calls that land there
    # fail with "x509: certificate is valid for <other>, not <svc>" or wrong
    # answers, intermittently (LeaderWorkerSet #528).
    - alert: KadmitWebhookSelectorCollision
      expr: |
        kadmit_watch_findings{check="KD301"} > 0
      for: 5m
      labels:
        severity: critical
      annotations:
        summary: {{ `'webhook {{ $labels.webhook }} ({{ $labels.configuration }}): its Service selects pods of more than one workload'` }}
        description: {{ `'Add a label unique to the webhook''s pods (e.g. app.kubernetes.io/instance) to the Service selector; "kadmit doctor {{ $labels.configuration }}" names both workloads and the label (KD301).'` }}
    # A Fail webhook that intercepts its own pods (or kube-system) cannot
    # come back once all its pods are gone: the ReplicaSet's creates are
    # rejected by the webhook that is down.
    - alert: KadmitWebhookSelfInterception
      expr: |
        kadmit_watch_findings{check=~"KD501|KD502"} * on (namespace, configuration, webhook) group_left kadmit_watch_webhook_info{failure_policy="Fail"} > 0
      for: 15m
      labels:
        severity: warning
      annotations:
        summary: {{ `'Fail webhook {{ $labels.webhook }} ({{ $labels.configuration }}) intercepts its own pods or kube-system ({{ $labels.check }})'` }}
        description: {{ `'Exclude its namespace and kube-system with the namespaceSelector; "kadmit doctor {{ $labels.configuration }}" prints the kubectl label or patch that does it (KD501, KD502).'` }}
    # Handshakes as the API server makes them fail now: calls fail now.
    - alert: KadmitWebhookTLSBroken
      expr: |
        kadmit_watch_findings{check=~"KD40[1-5]|KD409|KD202", severity="error"} > 0
      for: 2m
      labels:
        severity: critical
      annotations:
        summary: {{ `'webhook {{ $labels.webhook }} ({{ $labels.configuration }}): {{ $labels.check }}, the API server''s calls fail'` }}
        description: {{ `'caBundle, serving certificate or listener is wrong: see the Warning Event with reason {{ $labels.check }} on the configuration (kubectl get events -n default --field-selector reason={{ $labels.check }}) and run "kadmit doctor {{ $labels.configuration }}".'` }}
    # The API server itself could not call the webhook (watch.probe).
    - alert: KadmitWebhookProbeFailing
      expr: |
        increase(kadmit_watch_probe_failures_total[10m]) > 0
      labels:
        severity: warning
      annotations:
        summary: {{ `'webhook {{ $labels.webhook }} ({{ $labels.configuration }}): dry-run probe failed ({{ $labels.reason }})'` }}
        description: {{ `'The API server''s own call to the webhook failed; run "kadmit doctor {{ $labels.configuration }} --probe --probe-count 10" (KD7xx).'` }}
    # No watch replica leads: nothing above can fire.
    - alert: KadmitWatchDown
      expr: |
        absent(kadmit_watch_leader{namespace="{{ $ns }}"} == 1)
      for: 5m
      labels:
        severity: warning
      annotations:
        summary: No kadmit watch replica in {{ $ns }} holds the lease; webhook health is not being checked.
        description: {{ printf "'kubectl -n %s get pods -l app.kubernetes.io/component=watch; kubectl -n %s get lease %s; the watch''s log names a refused call if its RBAC is short.'" $ns $ns (include "kadmit.watchLeaseName" .) }}
{{- end -}}

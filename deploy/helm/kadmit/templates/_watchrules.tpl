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
    # A Fail webhook that intercepts its own pods (or kube-system, or the
    # pods its recovery depends on: the CNI, cluster DNS, its certificate
    # issuer) cannot come back once those pods are gone: their creates are
    # rejected by the webhook that is down (kueue #4074).
    - alert: KadmitWebhookSelfInterception
      expr: |
        kadmit_watch_findings{check=~"KD501|KD502|KD506"} * on (namespace, configuration, webhook) group_left kadmit_watch_webhook_info{failure_policy="Fail"} > 0
      for: 15m
      labels:
        severity: warning
      annotations:
        summary: {{ `'Fail webhook {{ $labels.webhook }} ({{ $labels.configuration }}) intercepts pods its own recovery depends on ({{ $labels.check }})'` }}
        description: {{ `'Exclude those namespaces (its own, kube-system, the CNI''s, cluster DNS''s, its certificate issuer''s) with the namespaceSelector; "kadmit doctor {{ $labels.configuration }}" names the pods and prints the kubectl label or patch that does it (KD501, KD502, KD506).'` }}
    # A NetworkPolicy isolates a Fail webhook's pods without admitting the
    # API server on the webhook port: where the CNI enforces it, every call
    # times out now ("context deadline exceeded") while the endpoints look
    # ready. Read statically: error severity only when doctor is sure.
    - alert: KadmitWebhookNetworkPolicyBlocks
      expr: |
        kadmit_watch_findings{check="KD107", severity="error"} > 0
      for: 5m
      labels:
        severity: critical
      annotations:
        summary: {{ `'Fail webhook {{ $labels.webhook }} ({{ $labels.configuration }}): a NetworkPolicy keeps the API server from its pods'` }}
        description: {{ `'A NetworkPolicy selects the webhook''s pods and admits nothing from the API server''s addresses on the webhook port; add the policy "kadmit doctor {{ $labels.configuration }}" prints (KD107).'` }}
    # The webhook stops serving at SIGTERM while the API server still calls
    # it and reuses pooled connections to it (kubernetes #127335): every
    # rollout or drain of a Fail webhook rejects some requests. A latent
    # risk: a long for, warning.
    - alert: KadmitWebhookNoDrainOnTermination
      expr: |
        kadmit_watch_findings{check="KD203", severity="warning"} > 0
      for: 1h
      labels:
        severity: warning
      annotations:
        summary: {{ `'Fail webhook {{ $labels.webhook }} ({{ $labels.configuration }}): its pods stop serving before the API server stops calling them'` }}
        description: {{ `'Give the container serving the webhook port a preStop sleep (10s) and a terminationGracePeriodSeconds above it; "kadmit doctor {{ $labels.configuration }}" prints the patch (KD203).'` }}
    # Two field managers take a webhook's caBundle or failurePolicy from
    # each other (an injector and Argo CD or Flux re-applying a manifest
    # that carries it): calls fail intermittently while the other side's
    # value holds. Seen in the watch's write history (A -> B -> A within 30
    # minutes) or, in one read, as an overwrite of the field's keeper.
    - alert: KadmitWebhookFieldManagerFight
      expr: |
        kadmit_watch_findings{check="KD609"} > 0
      for: 5m
      labels:
        severity: warning
      annotations:
        summary: {{ `'webhook {{ $labels.webhook }} ({{ $labels.configuration }}): two field managers keep rewriting its caBundle or failurePolicy'` }}
        description: {{ `'The Warning Event with reason KD609 on the configuration names both managers; leave the field to one of them (Argo CD ignoreDifferences with RespectIgnoreDifferences=true, no Replace=true; Flux: drop it from the manifest). "kadmit doctor {{ $labels.configuration }}" prints the snippet (KD609, docs/gitops.md).'` }}
    # The webhooks of one resource and operation can together take longer
    # than the API server's 60s request timeout (or the 10s of node
    # heartbeats and leader election): a latent risk that turns a slow
    # webhook into failed requests, Ignore webhooks included.
    - alert: KadmitWebhookTimeoutBudget
      expr: |
        kadmit_watch_findings{check="KD608"} > 0
      for: 1h
      labels:
        severity: warning
      annotations:
        summary: {{ `'webhook {{ $labels.webhook }} ({{ $labels.configuration }}): the webhooks it shares a resource with can take longer together than the client waits'` }}
        description: {{ `'Lower the listed webhooks'' timeoutSeconds until their sum (mutating ones twice with reinvocationPolicy IfNeeded, plus the slowest validating one) fits; "kadmit doctor {{ $labels.configuration }}" lists them and prints the patch (KD608).'` }}
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

# kadmit: the two commands a newcomer runs are `make demo` and `make test`.
SHELL := /usr/bin/env bash
GO ?= go
BIN := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/kadmit/kadmit/internal/version.Version=$(VERSION)
CONTROLPLANE_DIR := $(shell bash hack/controlplane.sh --print-dir)
# 14 targets × FUZZTIME plus a build each: 10s keeps `make fuzz` near 3 minutes.
FUZZTIME ?= 10s

.PHONY: all build controlplane cluster demo demo-cluster test unit e2e fuzz vet clean

all: build

build: ## build bin/kadmit
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/kadmit ./cmd/kadmit

controlplane: ## build the pinned kube-apiserver, etcd and kubectl into the cache (skips what is built)
	bash hack/controlplane.sh

# A real cluster's binaries (test/cluster, docs/real-cluster.md): what
# controlplane builds (the multi-call Kubernetes binary: kubelet, kube-proxy,
# controller-manager and scheduler are links to it), plus containerd 2.x,
# its runc shim and ctr from containerd's module (cold ~240 CPU-s), and
# Debian's runc, CNI plugins, iptables and conntrack (apt-get, as root, when
# missing). --node builds everything controlplane does, so cluster does not
# run controlplane first. make test runs it right after controlplane, while
# the older minors build in the background at the lowest priority, so the
# e2e suites start with every binary in place.
cluster: ## build controlplane's binaries and what test/cluster's nodes need: containerd, runc, CNI plugins (skips what is built)
	bash hack/controlplane.sh --node

# The older supported minors: the wire contract (v1 and v1beta1 reviews,
# registration by server-side apply) and the declared-policy differential
# run on each, next to the full e2e on the pinned version above.
OLDER_KUBE_VERSIONS ?= v1.36.3 v1.35.4
.PHONY: controlplane-minors e2e-minors
controlplane-minors: ## build kube-apiserver for each of OLDER_KUBE_VERSIONS (skips what is built)
	for v in $(OLDER_KUBE_VERSIONS); do KUBE_VERSION=$$v KUBE_APISERVER_GCFLAGS='all=-N -l' bash hack/controlplane.sh || exit 1; done

# On a fresh machine the older minors' kube-apiservers take about 10 minutes
# of both cores each. make test starts building them once v1.37.1 is built,
# in the background at the lowest CPU priority, so they use the cores the
# e2e suites leave idle; e2e-minors then waits for them (hack/controlplane.sh
# takes a lock per version). Where they are built this costs nothing. The
# build's output is in bin/controlplane-minors.log; if make test is
# interrupted, the build finishes on its own.
.PHONY: controlplane-minors-background
controlplane-minors-background: controlplane
	@mkdir -p $(BIN)
	@echo "building $(OLDER_KUBE_VERSIONS) in the background (log: $(BIN)/controlplane-minors.log)"
	@(nice -n 19 $(MAKE) --no-print-directory controlplane-minors > $(BIN)/controlplane-minors.log 2>&1 &)

e2e-minors: controlplane-minors ## the wire-contract e2e and the CEL differential on each older minor
	for v in $(OLDER_KUBE_VERSIONS); do \
	  dir=$$(KUBE_VERSION=$$v bash hack/controlplane.sh --print-dir); \
	  echo "== kube-apiserver $$v"; \
	  (cd test && KADMIT_E2E_REQUIRED=1 KADMIT_CONTROLPLANE_DIR=$$dir $(GO) test -p 1 -count=1 -timeout 15m \
	    -run 'TestSeedScenarios|TestAdmissionReviewV1beta1|TestCorpus' ./e2e/ ./e2e/celdiff/) || exit 1; \
	done

# The test infrastructure (control plane, network namespace, seed scenarios,
# demo, e2e suites) is the nested module test/, so that envtest and
# controller-runtime are dependencies of the tests only, never of kadmit.
demo: build controlplane ## the main job: a real kube-apiserver admits, mutates and rejects through kadmit
	cd test && $(GO) run ./demo --kadmit $(abspath $(BIN))/kadmit

# Not a set-up command: the same story on a real two-node cluster (kubelets,
# containerd, kube-proxy, in private namespaces here; needs root and what
# make cluster builds, once). kadmit's image is built from the Dockerfile's
# build stage, the chart installed with the Helm SDK; then seed 004 and 001
# happen for real to other controllers' webhooks, with kadmit doctor's
# diagnosis of each. About a minute once built (docs/real-cluster.md).
demo-cluster: build cluster ## kadmit's chart on a real two-node cluster, and seed failures 004 and 001 arising for real
	cd test/deploy && $(GO) run ./cmd/democluster --kadmit $(abspath $(BIN))/kadmit

# Modules kadmit's binaries must never link; their place is test/,
# test/deploy, bench/reference and the library's crmanager package.
# Checked on the packages built, not on go.mod: kadmit requires the
# library module pkg/webhookcerts, whose go.mod names controller-runtime
# for its crmanager subpackage, which kadmit never imports.
TEST_ONLY_MODULES := sigs.k8s.io/controller-runtime|helm.sh/helm
WEBHOOKCERTS := pkg/webhookcerts

vet:
	$(GO) vet ./...
	cd test && $(GO) vet ./...
	cd $(WEBHOOKCERTS) && $(GO) vet ./...
	@test -z "$$(gofmt -l cmd internal hack test pkg)" || { gofmt -l cmd internal hack test pkg; echo "gofmt needed"; exit 1; }
	@! $(GO) list -deps ./cmd/... ./internal/... | grep -E '^($(TEST_ONLY_MODULES))' || { echo "kadmit's packages import a test-only module (above)"; exit 1; }
	@! (cd $(WEBHOOKCERTS) && $(GO) list -deps . | grep -E '^(sigs.k8s.io/controller-runtime|k8s.io/apiserver|github.com/kadmit/kadmit/internal)') || { echo "the webhookcerts root package imports what only crmanager may (controller-runtime) or nothing may (above)"; exit 1; }
	bash hack/samedeps.sh
	bash hack/check-layers.sh
	GO=$(GO) bash hack/check-jsonlayer.sh

# The chart's RBAC for the cluster caches policies read is generated from
# their Go declarations; internal/served's TestChartCachesGenerated fails
# until this is run after a policy's caches change.
.PHONY: generate
generate: ## regenerate the chart's RBAC for the policies' caches (deploy/helm/kadmit/templates/_policycaches.tpl) from the Go declarations
	$(GO) run ./internal/served/chartrbac

# test/cluster/... runs in e2e, not here: its tests start a real cluster
# (root, namespaces, the node binaries make cluster builds).
unit: ## unit tests (no control plane)
	$(GO) test -count=1 ./...
	cd $(WEBHOOKCERTS) && $(GO) build ./... && $(GO) test -count=1 ./...
	cd test && $(GO) test -count=1 $$($(GO) list ./... | grep -v -e /e2e -e /test/cluster)

# -p 1: the suites assert recovery windows under load; running them side by
# side on two cores would make those windows measure each other.
e2e: cluster ## end-to-end tests against the real kube-apiserver and etcd, and the real cluster's own tests
	cd test && KADMIT_E2E_REQUIRED=1 KADMIT_CONTROLPLANE_DIR=$(CONTROLPLANE_DIR) $(GO) test -p 1 -count=1 -timeout 30m ./e2e/... ./cluster/...

fuzz: ## a short run of each fuzz target
	bash hack/fuzz.sh ./internal/admission FuzzDecodeReview $(FUZZTIME)
	bash hack/fuzz.sh ./internal/admission FuzzServeHTTP $(FUZZTIME)
	bash hack/fuzz.sh ./internal/admission FuzzDecodeEnvelope $(FUZZTIME)
	bash hack/fuzz.sh ./internal/admission FuzzScanValid $(FUZZTIME)
	bash hack/fuzz.sh ./internal/jsonedit FuzzValid $(FUZZTIME)
	bash hack/fuzz.sh ./internal/jsonedit FuzzApply $(FUZZTIME)
	bash hack/fuzz.sh ./internal/builtin FuzzPodName $(FUZZTIME)
	bash hack/fuzz.sh ./internal/builtin FuzzLifespan $(FUZZTIME)
	bash hack/fuzz.sh ./internal/builtin FuzzColocation $(FUZZTIME)
	bash hack/fuzz.sh ./internal/builtin FuzzNodeOvercommit $(FUZZTIME)
	bash hack/fuzz.sh ./internal/builtin FuzzJobQueue $(FUZZTIME)
	bash hack/fuzz.sh ./internal/builtin FuzzElasticQuota $(FUZZTIME)
	bash hack/fuzz.sh ./internal/builtin FuzzResourceFlavor $(FUZZTIME)
	bash hack/fuzz.sh ./internal/builtin FuzzKadmitConfig $(FUZZTIME)

# Order on a fresh machine: controlplane (the multi-call binary), then the
# older minors start in the background at nice 19, then cluster builds
# containerd at normal priority (it takes the cores first), then the e2e
# suites; the minors finish in the cores the suites leave idle.
test: vet unit controlplane-minors-background cluster e2e e2e-minors fuzz test-deploy ## everything CI runs

clean:
	rm -rf $(BIN)

# make bench: Go benchmarks of the handler path, then kadmit side by side with
# a controller-runtime webhook and a bare TLS server (bench/, docs/performance.md).
BENCH_DURATION ?= 10s
BENCH_WORK ?= $(BIN)/bench
BENCH_PROFILE ?= 5s
# The scaling phase: each point (GOMAXPROCS 1 and 2, c=64 and 256) BENCH_REPS
# times, BENCH_SCALE_DURATION each (0 skips it). Five: one unpinned 5 s run's
# CPU per request moves by about 5% from run to next on this 2-core
# machine, and with three the medians' 2/1 ratio moved across its 1.1 target
# (1.06, 1.06, 1.14 in three runs of one morning, code unchanged).
BENCH_REPS ?= 5
BENCH_SCALE_DURATION ?= 5s
.PHONY: bench
bench: build ## compare kadmit with controller-runtime and a bare TLS server, one core and two; BENCH_DURATION per run
	$(GO) test -run '^$$' -bench '^Benchmark(ServeHTTP_|DecodeReview)' -benchmem -benchtime 2s ./internal/admission
	$(GO) test -run '^$$' -bench '^BenchmarkServeHTTPParallel_' -benchmem -benchtime 2s -cpu 1,2 -count 3 ./internal/admission
	cd bench/reference && $(GO) build -o $(abspath $(BIN))/bench-reference . && $(GO) build -o $(abspath $(BIN))/bench-run ./cmd/benchrun
	$(BIN)/bench-run -kadmit $(BIN)/kadmit -reference $(BIN)/bench-reference -node internal/admission/testdata/node.json -duration $(BENCH_DURATION) -profile $(BENCH_PROFILE) -reps $(BENCH_REPS) -scale-duration $(BENCH_SCALE_DURATION) -work $(BENCH_WORK)

# make bench-sweep: how cost grows with object size, concurrency and the
# number of colocation profiles; tables on stdout, results.json and SVG plots
# in BENCH_SWEEP_WORK (copy the plots to docs/performance/ to publish them).
BENCH_SWEEP_SECONDS ?= 3s
BENCH_SWEEP_PROFILE_SECONDS ?= 5s
BENCH_SWEEP_WORK ?= $(BIN)/sweep
.PHONY: bench-sweep
bench-sweep: build ## cost against object size, concurrency and profiles, with SVG plots; BENCH_SWEEP_SECONDS per point
	cd bench/reference && $(GO) build -o $(abspath $(BIN))/bench-sweep ./cmd/sweep
	$(BIN)/bench-sweep -kadmit $(BIN)/kadmit -duration $(BENCH_SWEEP_SECONDS) -profile-duration $(BENCH_SWEEP_PROFILE_SECONDS) -work $(BENCH_SWEEP_WORK)

# make soak: kadmit (seed profile, --pprof on 127.0.0.1) under moderate
# load for SOAK_DURATION; VmRSS every 10 s, heap profiles after warm-up and
# at the end, inuse_space before/after.
SOAK_DURATION ?= 10m
SOAK_WORK ?= $(BIN)/soak
.PHONY: soak
soak: build ## bounded memory soak (SOAK_DURATION, default 10m): VmRSS samples, heap profiles before and after
	cd bench/reference && $(GO) build -o $(abspath $(BIN))/bench-soak ./cmd/soak
	$(BIN)/bench-soak -kadmit $(BIN)/kadmit -duration $(SOAK_DURATION) -work $(SOAK_WORK)

# Install and operate (deploy/, Dockerfile). The chart tests live in the
# nested module test/deploy so that Helm is a dependency of the tests only,
# never of kadmit itself.
.PHONY: manifests image-build-stage test-deploy
manifests: ## regenerate deploy/manifests, deploy/prometheus and deploy/dashboards from the Helm chart
	cd test/deploy && $(GO) run ./cmd/manifests

image-build-stage: ## run the Dockerfile's build stage here (no container engine) into bin/image/kadmit; fails unless the binary is static
	cd test/deploy && $(GO) run ./cmd/dockerbuild -o $(abspath $(BIN))/image/kadmit -version $(VERSION)

# The packages that start a real cluster (each re-executes its test binary
# in private namespaces) run here too: every package but kueuecluster (the
# Kueue comparison, make kueue-compare: two Kueue builds and two installs,
# too long for make test); -p 1 so two clusters never share the two cores
# while timing recoveries.
test-deploy: cluster ## chart lint/render, manifest drift, Dockerfile build stage, install on the real API server and on the real cluster
	cd test/deploy && KADMIT_E2E_REQUIRED=1 KADMIT_CONTROLPLANE_DIR=$(CONTROLPLANE_DIR) $(GO) test -p 1 -count=1 -timeout 30m $$($(GO) list ./... | grep -v /kueuecluster)

# make bench-apiserver: what the API server sees. A real kube-apiserver and
# etcd (test/controlplane), kadmit registered with the seed webhooks, then the
# controller-runtime reference registered with a copy of kadmit's
# configurations; `kadmit bench --through-apiserver` sends server-side dry-run
# pod creates at BENCH_APISERVER_RATE per second for BENCH_APISERVER_DURATION
# against each and reads the API server's webhook histogram
# (test/cmd/benchapi, docs/performance.md "Through the API server").
BENCH_APISERVER_RATE ?= 100
BENCH_APISERVER_DURATION ?= 60s
BENCH_APISERVER_WORK ?= $(BIN)/bench-apiserver
.PHONY: bench-apiserver
bench-apiserver: build controlplane ## webhook latency as the API server measures it, kadmit and controller-runtime; BENCH_APISERVER_RATE/DURATION
	cd bench/reference && $(GO) build -o $(abspath $(BIN))/bench-reference .
	cd test && KADMIT_CONTROLPLANE_DIR=$(CONTROLPLANE_DIR) $(GO) run ./cmd/benchapi -kadmit $(abspath $(BIN))/kadmit -reference $(abspath $(BIN))/bench-reference -rate $(BENCH_APISERVER_RATE) -duration $(BENCH_APISERVER_DURATION) -work $(abspath $(BENCH_APISERVER_WORK))

# make kueue: Kueue v0.17.0's controller manager twice, as upstream wires it
# (open-policy-agent/cert-controller) and with pkg/webhookcerts (test/kueue),
# plus Kueue's Helm chart, from the module proxy into ~/.cache/kadmit/kueue/
# v0.17.0 (KADMIT_KUEUE_DIR), for the cluster comparison. Cold: ~430 CPU-s
# for the first binary, ~85 more for the second; not part of test.
.PHONY: kueue
kueue: ## build Kueue's manager upstream and with pkg/webhookcerts, and copy its chart (skips what is built)
	bash hack/kueue.sh

# make kueue-compare: Kueue v0.17.0 with its own Helm chart (2 replicas,
# internal certificate management) on a fresh two-node cluster per variant,
# upstream's cert-controller against pkg/webhookcerts, under a steady load
# of Job creations (20/s, server-side dry run) through a fresh install, a
# rollout restart, the leader pod's deletion and a forced CA rotation
# (test/deploy/kueuecluster). Prints a markdown table, also written to
# KUEUE_COMPARE_REPORT; fails if the library variant fails a call once the
# Service routes to a ready replica (before that, the chart's Fail webhooks
# are refused by kube-proxy in both variants), or a scenario overruns its
# bound. Needs root.
# Typically 6-10 minutes on a 2-core machine: 3.5-5.5 min for upstream's
# variant (its install waits 10 s to 2 min for the kubelet to project the
# Secret), 2.5-3 min for the library's once it installs; a variant that
# never turns Available costs its 6-minute install bound; the bounds allow
# 25 minutes per variant. Not part of make test.
KUEUE_COMPARE_REPORT ?= $(BIN)/kueue-compare.md
.PHONY: kueue-compare
kueue-compare: kueue cluster ## Kueue's webhooks under load on the real cluster, cert-controller against pkg/webhookcerts (~10 min, root); table in KUEUE_COMPARE_REPORT
	@mkdir -p $(dir $(abspath $(KUEUE_COMPARE_REPORT)))
	cd test/deploy && KADMIT_E2E_REQUIRED=1 KADMIT_CONTROLPLANE_DIR=$(CONTROLPLANE_DIR) KADMIT_KUEUE_REPORT=$(abspath $(KUEUE_COMPARE_REPORT)) $(GO) test -count=1 -v -timeout 60m -run '^TestKueueCertificatesUnderLoad$$' ./kueuecluster/

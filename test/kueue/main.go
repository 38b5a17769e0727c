// Command manager-webhookcerts is Kueue v0.17.0's controller manager with its
// webhook certificates managed by github.com/kadmit/kadmit/pkg/webhookcerts
// instead of open-policy-agent/cert-controller. hack/kueue.sh builds it next
// to upstream's own cmd/kueue (manager-upstream); a cluster test installs
// Kueue's Helm chart once with each and compares them.
//
// It reads the same flags and the same configuration file and wires the same
// controllers, webhooks, scheduler and visibility server as
// sigs.k8s.io/kueue@v0.17.0/cmd/kueue/main.go ("upstream" below; line numbers
// are that file's). Only the certificates differ, in three places:
//
//   - bootstrap: webhookcerts.New + Rotator.Bootstrap replace
//     cert.BootstrapCerts (upstream 250-258), which starts a throwaway
//     manager with a cert-controller rotator and waits until the kubelet has
//     projected the rotated Secret into the pod;
//   - serving: the webhook server takes its certificate from the rotator's
//     memory (Rotator.TLSOpt) rather than from files in CertDir watched by
//     controller-runtime's certwatcher;
//   - readiness: Rotator.ReadyzCheck replaces the certsReady channel that
//     cert.ManageCerts closes (upstream 275-284, 526-553).
//
// The rest of the wiring is in kueue.go, which calls the exported Kueue
// packages upstream's unexported helpers call.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	zaplog "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/util/flowcontrol"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
	"github.com/kadmit/kadmit/pkg/webhookcerts/crmanager"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	qcache "sigs.k8s.io/kueue/pkg/cache/queue"
	schdcache "sigs.k8s.io/kueue/pkg/cache/scheduler"
	"sigs.k8s.io/kueue/pkg/config"
	"sigs.k8s.io/kueue/pkg/debugger"
	"sigs.k8s.io/kueue/pkg/dra"
	"sigs.k8s.io/kueue/pkg/features"
	"sigs.k8s.io/kueue/pkg/metrics"
	preemptexpectations "sigs.k8s.io/kueue/pkg/scheduler/preemption/expectations"
	"sigs.k8s.io/kueue/pkg/scheduler/preemption/fairsharing"
	utillogging "sigs.k8s.io/kueue/pkg/util/logging"
	"sigs.k8s.io/kueue/pkg/util/roletracker"
	"sigs.k8s.io/kueue/pkg/util/tlsconfig"
	"sigs.k8s.io/kueue/pkg/util/useragent"
	"sigs.k8s.io/kueue/pkg/version"
	"sigs.k8s.io/kueue/pkg/visibility"
	"sigs.k8s.io/kueue/pkg/webhooks"

	// Client auth plugins and the job framework integrations, as upstream
	// links them (upstream 90-94).
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	_ "sigs.k8s.io/kueue/pkg/controller/jobs"
)

var setupLog = ctrl.Log.WithName("setup")

func main() {
	if err := run(); err != nil {
		setupLog.Error(err, "exiting")
		os.Exit(1)
	}
}

func run() error {
	// Upstream's flags (upstream 126-144), with the same defaults.
	configFile := flag.String("config", "", "The controller will load its initial configuration from this file. "+
		"Omit this flag to use the default configuration values. ")
	featureGates := flag.String("feature-gates", "", "A set of key=value pairs that describe feature gates for alpha/experimental features.")
	visibilityServerPort := flag.Int("visibility-server-port", configapi.DefaultVisibilityBindPort, "The port the visibility server binds to.")
	zapOptions := zap.Options{
		TimeEncoder: zapcore.RFC3339NanoTimeEncoder,
		ZapOpts:     []zaplog.Option{zaplog.AddCaller(), zaplog.WrapCore(utillogging.NewCustomLogProcessor)},
	}
	zapOptions.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOptions)))

	// Kueue's configuration loader and feature gates (upstream 149-174, 620-631).
	options, cfg, err := config.Load(scheme, *configFile)
	if err != nil {
		return fmt.Errorf("unable to load the configuration: %w", err)
	}
	if cfgStr, err := config.Encode(scheme, &cfg); err != nil {
		return fmt.Errorf("unable to encode the configuration: %w", err)
	} else {
		setupLog.Info("Successfully loaded configuration", "config", cfgStr)
	}
	if err := config.ValidateFeatureGates(*featureGates, cfg.FeatureGates).ToAggregate(); err != nil {
		return fmt.Errorf("conflicting feature gates detected: %w", err)
	}
	if *featureGates != "" {
		err = utilfeature.DefaultMutableFeatureGate.Set(*featureGates)
	} else {
		err = utilfeature.DefaultMutableFeatureGate.SetFromMap(cfg.FeatureGates)
	}
	if err != nil {
		return fmt.Errorf("unable to set feature gates: %w", err)
	}
	setupLog.Info("Initializing", "gitVersion", version.GitVersion, "gitCommit", version.GitCommit,
		"buildDate", version.BuildDate, "certificates", "github.com/kadmit/kadmit/pkg/webhookcerts")
	features.LogFeatureGates(setupLog)

	// Metrics server and TLS options, unchanged (upstream 180-234): with
	// internal certificate management the metrics server keeps
	// controller-runtime's self-signed certificate, as upstream's does.
	metricsOptions := metricsserver.Options{
		BindAddress:    cfg.Metrics.BindAddress,
		SecureServing:  true,
		FilterProvider: filters.WithAuthenticationAndAuthorization,
	}
	parsedTLSConfig := &tlsconfig.TLS{}
	if features.Enabled(features.TLSOptions) {
		if parsedTLSConfig, err = tlsconfig.ParseTLSOptions(cfg.TLS); err != nil {
			return fmt.Errorf("unable to parse TLS options from configuration: %w", err)
		}
	}
	if parsedTLSConfig != nil {
		metricsOptions.TLSOpts = append(metricsOptions.TLSOpts, tlsconfig.BuildTLSOptions(parsedTLSConfig)...)
	}
	// The webhook server: port, host, CertDir and TLS options from the
	// configuration, built by Kueue's own helper.
	config.AddWebhookSettingsTo(&options, &cfg)
	var metricsCertWatcher *certwatcher.CertWatcher
	if !internalCerts(&cfg) {
		// cert-manager mode: the metrics certificate is mounted (upstream 204-223).
		dir := "/etc/kueue/metrics/certs"
		if metricsCertWatcher, err = certwatcher.New(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")); err != nil {
			return fmt.Errorf("unable to initialize metrics certificate watcher: %w", err)
		}
		metricsOptions.TLSOpts = append(metricsOptions.TLSOpts, func(c *tls.Config) { c.GetCertificate = metricsCertWatcher.GetCertificate })
	}
	options.Metrics = metricsOptions

	lqMetrics := metrics.NewLocalQueueMetricsConfig(cfg.Metrics.LocalQueueMetrics)
	var customLabels *metrics.CustomLabels
	if features.Enabled(features.CustomMetricLabels) {
		customLabels = metrics.NewCustomLabels(cfg.Metrics.CustomLabels)
	} else if len(cfg.Metrics.CustomLabels) > 0 {
		setupLog.Info("metrics.customLabels is configured but CustomMetricLabels feature gate is disabled; custom labels will have no effect")
	}
	metrics.Register()

	// Client configuration: user agent and client-side rate limit (upstream 236-248).
	kubeConfig := ctrl.GetConfigOrDie()
	if kubeConfig.UserAgent == "" {
		kubeConfig.UserAgent = useragent.Default()
	}
	if *cfg.ClientConnection.QPS >= 0.0 {
		kubeConfig.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(*cfg.ClientConnection.QPS, int(*cfg.ClientConnection.Burst))
	}
	setupLog.V(2).Info("K8S Client", "qps", *cfg.ClientConnection.QPS, "burst", *cfg.ClientConnection.Burst)
	ctx := ctrl.SetupSignalHandler()

	// Certificates, through the library. Bootstrap returns once the Secret
	// holds a usable CA and serving certificate, the rotator serves it from
	// memory and every configuration and conversion CRD below has its
	// caBundle: what upstream's BootstrapCerts waits for, without a second
	// manager and without waiting for the kubelet to refresh the mounted
	// Secret. It runs before the manager is built, as upstream's does, so
	// that the conversion webhooks are trusted before the manager's caches
	// list Kueue's CRDs.
	var rotator *webhookcerts.Rotator
	if internalCerts(&cfg) {
		if rotator, err = webhookcerts.New(kubeConfig, rotatorOptions(&cfg)); err != nil {
			return fmt.Errorf("unable to set up certificate rotation: %w", err)
		}
		if err := rotator.Bootstrap(ctx); err != nil {
			return fmt.Errorf("unable to bootstrap certificates: %w", err)
		}
	}

	if features.Enabled(features.MultiKueueClusterProfile) {
		if err := config.ConfigureClusterProfileCache(ctx, setupLog, &options, kubeConfig, cfg); err != nil {
			return fmt.Errorf("unable to configure cluster profile: %w", err)
		}
	}

	if rotator != nil && options.WebhookServer != nil {
		// A replica being stopped (rollout, eviction, a deleted leader) goes
		// on answering for crmanager.DefaultDrain after SIGTERM, each answer
		// with Connection: close, so the API server's pooled connections
		// and kube-proxy leave it before it closes its listener; the
		// chart's terminationGracePeriodSeconds (10) covers it.
		options.WebhookServer = crmanager.Drain(options.WebhookServer, crmanager.DefaultDrain)
	}
	mgr, err := ctrl.NewManager(kubeConfig, options)
	if err != nil {
		return fmt.Errorf("unable to create the manager: %w", err)
	}
	if rotator != nil {
		// The webhook server serves the rotator's certificate from memory
		// (Rotator.TLSOpt; its CertDir, where the chart mounts the Secret
		// read-only, is not read: the kubelet's copy can lag the Secret by
		// a minute), and the rotator runs in the manager for rotation and
		// caBundle re-injection, on every replica, leader or not, as
		// upstream's cert.ManageCerts rotator does.
		if err := crmanager.Attach(mgr, rotator); err != nil {
			return fmt.Errorf("unable to set up certificate rotation: %w", err)
		}
	}
	if metricsCertWatcher != nil {
		if err := mgr.Add(metricsCertWatcher); err != nil {
			return fmt.Errorf("unable to start metrics certificate watcher: %w", err)
		}
	}
	if err := setupProbes(mgr, rotator); err != nil {
		return err
	}

	// Kueue itself (upstream 273, 285-390): caches, queues, indexes,
	// controllers, webhooks, visibility server, scheduler.
	roleTracker := setupRoleTracker(ctx, mgr, &cfg)
	cacheOptions := []schdcache.Option{
		schdcache.WithPodsReadyTracking(blockForPodsReady(&cfg)),
		schdcache.WithRoleTracker(roleTracker),
		schdcache.WithResourceMetrics(cfg.Metrics.EnableClusterQueueResources),
		schdcache.WithCustomLabels(customLabels),
		schdcache.WithLocalQueueMetrics(lqMetrics),
	}
	queueOptions := []qcache.Option{
		qcache.WithPodsReadyRequeuingTimestamp(podsReadyRequeuingTimestamp(&cfg)),
		qcache.WithRoleTracker(roleTracker),
		qcache.WithCustomLabels(customLabels),
		qcache.WithLocalQueueMetrics(lqMetrics),
	}
	if r := cfg.Resources; r != nil && len(r.ExcludeResourcePrefixes) > 0 {
		cacheOptions = append(cacheOptions, schdcache.WithExcludedResourcePrefixes(r.ExcludeResourcePrefixes))
		queueOptions = append(queueOptions, qcache.WithExcludedResourcePrefixes(r.ExcludeResourcePrefixes))
	}
	if r := cfg.Resources; r != nil && len(r.Transformations) > 0 {
		cacheOptions = append(cacheOptions, schdcache.WithResourceTransformations(r.Transformations))
		queueOptions = append(queueOptions, qcache.WithResourceTransformations(r.Transformations))
	}
	if r := cfg.Resources; features.Enabled(features.DynamicResourceAllocation) && r != nil && len(r.DeviceClassMappings) > 0 {
		if err := dra.CreateMapperFromConfiguration(r.DeviceClassMappings); err != nil {
			return fmt.Errorf("failed to initialize DRA mapper from configuration: %w", err)
		}
		setupLog.Info("DRA mapper initialized from configuration")
	}
	if cfg.FairSharing != nil {
		cacheOptions = append(cacheOptions, schdcache.WithFairSharing(fairsharing.Enabled(cfg.FairSharing)))
	}
	if cfg.AdmissionFairSharing != nil {
		queueOptions = append(queueOptions, qcache.WithAdmissionFairSharing(cfg.AdmissionFairSharing))
		cacheOptions = append(cacheOptions, schdcache.WithAdmissionFairSharing(cfg.AdmissionFairSharing))
	}
	cCache := schdcache.New(mgr.GetClient(), cacheOptions...)
	requeuer := qcache.NewRequeuer()
	if err := mgr.Add(requeuer); err != nil {
		return fmt.Errorf("unable to add workloadRequeuer to manager: %w", err)
	}
	preemptionExpectations := preemptexpectations.New()
	queueOptions = append(queueOptions, qcache.WithPreemptionExpectations(preemptionExpectations))
	queues := qcache.NewManager(mgr.GetClient(), cCache, requeuer, queueOptions...)

	if err := setupIndexes(ctx, mgr, &cfg); err != nil {
		return fmt.Errorf("unable to setup indexes: %w", err)
	}
	debugger.NewDumper(cCache, queues).ListenForSignal(ctx)
	serverVersionFetcher, err := setupServerVersionFetcher(mgr, kubeConfig)
	if err != nil {
		return fmt.Errorf("unable to setup server version fetcher: %w", err)
	}
	if roleTracker != nil {
		roleTracker.OnElected(func() {
			metrics.ClearGaugeMetricsForRole(roletracker.RoleFollower)
			cCache.ResyncGaugeMetrics()
			queues.ResyncGaugeMetrics()
		})
	}
	if err := setupControllers(ctx, mgr, cCache, queues, &cfg, serverVersionFetcher, roleTracker, preemptionExpectations, customLabels); err != nil {
		return fmt.Errorf("unable to setup controllers: %w", err)
	}
	if failedWebhook, err := webhooks.Setup(mgr, roleTracker); err != nil {
		return fmt.Errorf("unable to create webhook %s: %w", failedWebhook, err)
	}
	go queues.CleanUpOnContext(ctx)
	go cCache.CleanUpOnContext(ctx)
	if features.Enabled(features.VisibilityOnDemand) {
		go func() {
			if err := visibility.CreateAndStartVisibilityServer(ctx, queues, &cfg, kubeConfig, *visibilityServerPort, parsedTLSConfig); err != nil {
				setupLog.Error(err, "Unable to create and start visibility server")
				os.Exit(1)
			}
		}()
	}
	if err := setupScheduler(mgr, cCache, queues, &cfg, roleTracker, preemptionExpectations, customLabels); err != nil {
		return fmt.Errorf("could not setup scheduler: %w", err)
	}

	setupLog.Info("Starting manager")
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("could not run manager: %w", err)
	}
	return nil
}

// internalCerts reports whether Kueue manages its webhook certificates itself
// (the default; the chart turns it off only with enableCertManager).
func internalCerts(cfg *configapi.Configuration) bool {
	return cfg.InternalCertManagement != nil && *cfg.InternalCertManagement.Enable
}

// rotatorOptions names what upstream's rotator manages: the same Secret,
// Service DNS name, CA name and organization, webhook configurations and
// conversion CRDs (sigs.k8s.io/kueue@v0.17.0/pkg/util/cert/cert.go,
// buildCertRotatorConfig). Configuration names derive from the Service's,
// as there: "kueue-webhook-service" owns "kueue-validating-webhook-configuration"
// and "kueue-mutating-webhook-configuration".
func rotatorOptions(cfg *configapi.Configuration) webhookcerts.Options {
	ns, svc := *cfg.Namespace, *cfg.InternalCertManagement.WebhookServiceName
	base := strings.TrimSuffix(svc, "-webhook-service")
	hooks := []webhookcerts.WebhookInfo{
		{Type: webhookcerts.Validating, Name: base + "-validating-webhook-configuration"},
		{Type: webhookcerts.Mutating, Name: base + "-mutating-webhook-configuration"},
	}
	// The CRDs whose conversion webhook this server serves.
	for _, crd := range []string{"localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters"} {
		hooks = append(hooks, webhookcerts.WebhookInfo{Type: webhookcerts.CRDConversion, Name: crd + ".kueue.x-k8s.io"})
	}
	return webhookcerts.Options{
		SecretKey: types.NamespacedName{Namespace: ns, Name: *cfg.InternalCertManagement.WebhookSecretName},
		// The chart's Service listens on 443 (values.yaml webhookService.ports)
		// and its webhook configurations and CRDs name no port, so 443.
		Service:        &webhookcerts.ServiceRef{Namespace: ns, Name: svc, Port: 443},
		DNSName:        svc + "." + ns + ".svc",
		Webhooks:       hooks,
		CAName:         "kueue-ca",
		CAOrganization: "kueue",
		Logger:         ctrl.Log.WithName("webhookcerts"),
		// No CertDir: the certificate is served from memory, and the chart
		// mounts the Secret read-only at cfg.Webhook.CertDir.
	}
}

// setupProbes registers /healthz and /readyz (upstream 526-553). Upstream's
// /readyz waits for certsReady, then dials the webhook server. Here
// crmanager.ReadyzCheck asks the rotator whether the API server would trust
// what is served (the served chain verifies against the live caBundle of
// every configuration and CRD above, for the Service's name), then dials the
// webhook server as upstream does, so a replica is ready only once both hold.
func setupProbes(mgr ctrl.Manager, rotator *webhookcerts.Rotator) error {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("unable to set up health check: %w", err)
	}
	ready := func(req *http.Request) error {
		// Called late, as upstream does: GetWebhookServer adds the server
		// to the manager on first use.
		return mgr.GetWebhookServer().StartedChecker()(req)
	}
	if rotator != nil {
		ready = crmanager.ReadyzCheck(mgr, rotator)
	}
	if err := mgr.AddReadyzCheck("readyz", ready); err != nil {
		return fmt.Errorf("unable to set up ready check: %w", err)
	}
	return nil
}

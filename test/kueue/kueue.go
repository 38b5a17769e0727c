package main

// Kueue's own wiring, nothing to do with certificates: the scheme, field
// indexes, controllers, scheduler, server version fetcher and role tracker
// that sigs.k8s.io/kueue@v0.17.0/cmd/kueue/main.go sets up in unexported
// helpers of its package main. Each function here calls the exported Kueue
// packages the upstream helper of the same name calls, in the same order
// with the same options; line numbers are that file's.

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	autoscaling "k8s.io/autoscaler/cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	inventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	ctrl "sigs.k8s.io/controller-runtime"

	configapiv1beta1 "sigs.k8s.io/kueue/apis/config/v1beta1"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueuealpha "sigs.k8s.io/kueue/apis/kueue/v1alpha1"
	kueuev1beta1 "sigs.k8s.io/kueue/apis/kueue/v1beta1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	qcache "sigs.k8s.io/kueue/pkg/cache/queue"
	schdcache "sigs.k8s.io/kueue/pkg/cache/scheduler"
	"sigs.k8s.io/kueue/pkg/constants"
	"sigs.k8s.io/kueue/pkg/controller/admissionchecks/multikueue"
	"sigs.k8s.io/kueue/pkg/controller/admissionchecks/multikueue/externalframeworks"
	"sigs.k8s.io/kueue/pkg/controller/admissionchecks/provisioning"
	"sigs.k8s.io/kueue/pkg/controller/core"
	"sigs.k8s.io/kueue/pkg/controller/core/indexer"
	"sigs.k8s.io/kueue/pkg/controller/failurerecovery"
	"sigs.k8s.io/kueue/pkg/controller/jobframework"
	"sigs.k8s.io/kueue/pkg/controller/tas"
	tasindexer "sigs.k8s.io/kueue/pkg/controller/tas/indexer"
	dispatcher "sigs.k8s.io/kueue/pkg/controller/workloaddispatcher"
	"sigs.k8s.io/kueue/pkg/features"
	"sigs.k8s.io/kueue/pkg/metrics"
	"sigs.k8s.io/kueue/pkg/scheduler"
	"sigs.k8s.io/kueue/pkg/util/expectations"
	"sigs.k8s.io/kueue/pkg/util/kubeversion"
	"sigs.k8s.io/kueue/pkg/util/roletracker"
	"sigs.k8s.io/kueue/pkg/util/waitforpodsready"
)

// scheme holds every type the manager reads or writes, including both
// configuration versions (the loader converts a v1beta1 file) and the job
// integrations' types (upstream 97-123).
var scheme = runtime.NewScheme()

func init() {
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, schedulingv1.AddToScheme, resourceapi.AddToScheme,
		kueue.AddToScheme, kueuev1beta1.AddToScheme, kueuealpha.AddToScheme,
		configapiv1beta1.AddToScheme, configapi.AddToScheme,
		autoscaling.AddToScheme, inventoryv1alpha1.AddToScheme,
	} {
		utilruntime.Must(add(scheme))
	}
	utilruntime.Must(jobframework.ForEachIntegration(func(_ string, cb jobframework.IntegrationCallbacks) error {
		if cb.AddToScheme != nil {
			return cb.AddToScheme(scheme)
		}
		return nil
	}))
}

// setupIndexes: upstream 399-428.
func setupIndexes(ctx context.Context, mgr ctrl.Manager, cfg *configapi.Configuration) error {
	if err := indexer.Setup(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := provisioning.ServerSupportsProvisioningRequest(mgr); err != nil {
		setupLog.Error(err, "Skipping admission check controller setup: Provisioning Requests not supported (Possible cause: missing or unsupported cluster-autoscaler)")
	} else if err := provisioning.SetupIndexer(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("could not setup provisioning indexer: %w", err)
	}
	if features.Enabled(features.TopologyAwareScheduling) {
		if err := tasindexer.SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
			return fmt.Errorf("could not setup TAS indexer: %w", err)
		}
	}
	if features.Enabled(features.MultiKueue) {
		if err := multikueue.SetupIndexer(ctx, mgr.GetFieldIndexer(), *cfg.Namespace); err != nil {
			return fmt.Errorf("could not setup multikueue indexer: %w", err)
		}
	}
	return jobframework.SetupIndexes(ctx, mgr.GetFieldIndexer(), jobframework.WithEnabledFrameworks(cfg.Integrations.Frameworks))
}

// setupControllers: upstream 430-524.
func setupControllers(ctx context.Context, mgr ctrl.Manager, cCache *schdcache.Cache, queues *qcache.Manager,
	cfg *configapi.Configuration, serverVersionFetcher *kubeversion.ServerVersionFetcher, roleTracker *roletracker.RoleTracker,
	preemptionExpectations *expectations.Store, customLabels *metrics.CustomLabels) error {
	if failed, err := core.SetupControllers(mgr, queues, cCache, cfg, roleTracker, preemptionExpectations, customLabels); err != nil {
		return fmt.Errorf("unable to create controller %s: %w", failed, err)
	}
	if features.Enabled(features.FailureRecoveryPolicy) {
		if failed, err := failurerecovery.SetupControllers(mgr, cfg, roleTracker); err != nil {
			return fmt.Errorf("could not setup FailureRecovery controller %s: %w", failed, err)
		}
	}
	if err := provisioning.ServerSupportsProvisioningRequest(mgr); err != nil {
		setupLog.Info("Skipping provisioning controller setup: Provisioning Requests not supported (Possible cause: missing or unsupported cluster-autoscaler)")
	} else {
		c, err := provisioning.NewController(mgr.GetClient(), mgr.GetEventRecorderFor("kueue-provisioning-request-controller"), roleTracker)
		if err != nil {
			return fmt.Errorf("could not create the provisioning controller: %w", err)
		}
		if err := c.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("could not setup provisioning controller: %w", err)
		}
	}
	if features.Enabled(features.MultiKueue) {
		if err := setupMultiKueue(mgr, cfg, roleTracker); err != nil {
			return err
		}
	}
	if features.Enabled(features.TopologyAwareScheduling) {
		if failed, err := tas.SetupControllers(mgr, queues, cCache, cfg, roleTracker); err != nil {
			return fmt.Errorf("could not setup TAS controller %s: %w", failed, err)
		}
	}
	nsSelector, err := metav1.LabelSelectorAsSelector(cfg.ManagedJobsNamespaceSelector)
	if err != nil {
		return fmt.Errorf("failed to parse managedJobsNamespaceSelector: %w", err)
	}
	if err := jobframework.SetupControllers(ctx, mgr, setupLog,
		jobframework.WithManageJobsWithoutQueueName(cfg.ManageJobsWithoutQueueName),
		jobframework.WithWaitForPodsReady(cfg.WaitForPodsReady),
		jobframework.WithKubeServerVersion(serverVersionFetcher),
		jobframework.WithEnabledFrameworks(cfg.Integrations.Frameworks),
		jobframework.WithEnabledExternalFrameworks(cfg.Integrations.ExternalFrameworks),
		jobframework.WithManagerName(constants.KueueName),
		jobframework.WithLabelKeysToCopy(cfg.Integrations.LabelKeysToCopy),
		jobframework.WithCache(cCache),
		jobframework.WithQueues(queues),
		jobframework.WithObjectRetentionPolicies(cfg.ObjectRetentionPolicies),
		jobframework.WithRoleTracker(roleTracker),
		jobframework.WithCustomLabels(customLabels),
		jobframework.WithManagedJobsNamespaceSelector(nsSelector),
	); err != nil {
		return fmt.Errorf("unable to create controller or webhook for kubernetesVersion %v: %w", serverVersionFetcher.GetServerVersion(), err)
	}
	return nil
}

// setupMultiKueue: the MultiKueue part of upstream's setupControllers (456-491).
func setupMultiKueue(mgr ctrl.Manager, cfg *configapi.Configuration, roleTracker *roletracker.RoleTracker) error {
	adapters, err := jobframework.GetMultiKueueAdapters(sets.New(cfg.Integrations.Frameworks...))
	if err != nil {
		return fmt.Errorf("could not get the enabled multikueue adapters: %w", err)
	}
	if features.Enabled(features.MultiKueueAdaptersForCustomJobs) && cfg.MultiKueue != nil && len(cfg.MultiKueue.ExternalFrameworks) > 0 {
		external, err := externalframeworks.NewAdapters(cfg.MultiKueue.ExternalFrameworks)
		if err != nil {
			return fmt.Errorf("could not create external framework adapters: %w", err)
		}
		for _, adapter := range external {
			gvk := adapter.GVK().String()
			setupLog.Info("Creating external framework MultiKueue adapter", "gvk", gvk)
			adapters[gvk] = adapter
		}
	}
	if err := multikueue.SetupControllers(mgr, *cfg.Namespace,
		multikueue.WithGCInterval(cfg.MultiKueue.GCInterval.Duration),
		multikueue.WithOrigin(ptr.Deref(cfg.MultiKueue.Origin, configapi.DefaultMultiKueueOrigin)),
		multikueue.WithWorkerLostTimeout(cfg.MultiKueue.WorkerLostTimeout.Duration),
		multikueue.WithAdapters(adapters),
		multikueue.WithDispatcherName(ptr.Deref(cfg.MultiKueue.DispatcherName, configapi.MultiKueueDispatcherModeAllAtOnce)),
		multikueue.WithClusterProfiles(cfg.MultiKueue.ClusterProfile),
		multikueue.WithRoleTracker(roleTracker),
	); err != nil {
		return fmt.Errorf("could not setup MultiKueue controller: %w", err)
	}
	if failed, err := dispatcher.SetupControllers(mgr, cfg, roleTracker); err != nil {
		return fmt.Errorf("could not setup Dispatcher controller %q for MultiKueue: %w", failed, err)
	}
	return nil
}

// setupScheduler: upstream 555-574.
func setupScheduler(mgr ctrl.Manager, cCache *schdcache.Cache, queues *qcache.Manager, cfg *configapi.Configuration,
	roleTracker *roletracker.RoleTracker, preemptionExpectations *expectations.Store, customLabels *metrics.CustomLabels) error {
	sched := scheduler.New(queues, cCache, mgr.GetClient(), mgr.GetEventRecorderFor(constants.AdmissionName),
		scheduler.WithPodsReadyRequeuingTimestamp(podsReadyRequeuingTimestamp(cfg)),
		scheduler.WithFairSharing(cfg.FairSharing),
		scheduler.WithAdmissionFairSharing(cfg.AdmissionFairSharing),
		scheduler.WithRoleTracker(roleTracker),
		scheduler.WithPreemptionExpectations(preemptionExpectations),
		scheduler.WithCustomLabels(customLabels),
	)
	if err := mgr.Add(sched); err != nil {
		return fmt.Errorf("unable to add scheduler to manager: %w", err)
	}
	return nil
}

// setupServerVersionFetcher: upstream 576-593; the job integrations need the
// server's version before the manager starts.
func setupServerVersionFetcher(mgr ctrl.Manager, kubeConfig *rest.Config) (*kubeversion.ServerVersionFetcher, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(kubeConfig)
	if err != nil {
		return nil, fmt.Errorf("unable to create the discovery client: %w", err)
	}
	fetcher := kubeversion.NewServerVersionFetcher(dc)
	if err := mgr.Add(fetcher); err != nil {
		return nil, fmt.Errorf("unable to add server version fetcher to manager: %w", err)
	}
	if err := fetcher.FetchServerVersion(); err != nil {
		return nil, fmt.Errorf("failed to fetch kubernetes server version: %w", err)
	}
	return fetcher, nil
}

// setupRoleTracker: upstream 595-604; nil without leader election.
func setupRoleTracker(ctx context.Context, mgr ctrl.Manager, cfg *configapi.Configuration) *roletracker.RoleTracker {
	if cfg.LeaderElection != nil && ptr.Deref(cfg.LeaderElection.LeaderElect, false) {
		tracker := roletracker.NewRoleTracker(mgr.Elected())
		go tracker.Start(ctx, setupLog)
		setupLog.Info("RoleTracker: leader election enabled")
		return tracker
	}
	setupLog.Info("RoleTracker: running in standalone mode")
	return nil
}

// blockForPodsReady: upstream 606-610.
func blockForPodsReady(cfg *configapi.Configuration) bool {
	return waitforpodsready.Enabled(cfg.WaitForPodsReady) && ptr.Deref(cfg.WaitForPodsReady.BlockAdmission, false)
}

// podsReadyRequeuingTimestamp: upstream 612-618.
func podsReadyRequeuingTimestamp(cfg *configapi.Configuration) configapi.RequeuingTimestamp {
	if w := cfg.WaitForPodsReady; w != nil && w.RequeuingStrategy != nil && w.RequeuingStrategy.Timestamp != nil {
		return *w.RequeuingStrategy.Timestamp
	}
	return configapi.EvictionTimestamp
}

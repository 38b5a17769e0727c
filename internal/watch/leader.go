package watch

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// elect competes for the Lease until ctx ends, as internal/lifecycle's
// elect does for certificate rotation. While this replica leads, the
// evaluation loop exports per-webhook series and emits Events; every
// replica evaluates, so a new leader reports at its first evaluation.
// With LeaderElect off this replica always leads.
func (c *Controller) elect(ctx context.Context) {
	if !c.o.LeaderElect {
		return
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.o.Namespace, Name: c.o.LeaseName},
		Client:     c.o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.o.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   c.o.LeaseDuration,
			RenewDeadline:   c.o.RenewDeadline,
			RetryPeriod:     c.o.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            c.o.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					c.leading.Store(true)
					c.o.Log.Info("became leader: reporting series and Events", "lease", c.o.LeaseName, "identity", c.o.Identity)
					c.kick()
					<-lctx.Done()
				},
				OnStoppedLeading: func() {
					// client-go calls this when Run returns, led or not.
					if c.leading.Swap(false) {
						c.o.Log.Info("stopped leading", "lease", c.o.LeaseName)
						c.kick()
					}
				},
			},
		})
		if err != nil {
			c.o.Log.Error("leader election misconfigured", "error", err)
			return
		}
		le.Run(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(c.o.RetryPeriod):
		}
	}
}

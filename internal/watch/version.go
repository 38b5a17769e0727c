package watch

import (
	"context"
	"time"

	"k8s.io/client-go/discovery"
)

// VersionInterval is how often the watch reads the API server's /version
// again after the read at start: an upgrade of the control plane changes
// which rules hold (KD610: the virtual resources webhooks no longer see
// from 1.37; KD004: static admission configuration), and control-plane
// upgrades take far longer than this.
const VersionInterval = 10 * time.Minute

// versionTimeout bounds one /version read.
const versionTimeout = 10 * time.Second

// readVersion reads /version (discovery; every authenticated user may,
// through the API server's default system:public-info-viewer binding)
// and stores it for the snapshots. A failed read keeps the last version
// read (nil before any: the version-aware checks then say they could not
// tell). changed reports a new version.
func (c *Controller) readVersion(ctx context.Context) (changed bool) {
	rctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	v, err := discovery.ToServerVersionInterfaceWithContext(c.o.Client.Discovery()).ServerVersionWithContext(rctx)
	if err != nil {
		if ctx.Err() == nil {
			c.o.Log.Warn("reading the API server's version failed; keeping the last read", "error", err)
		}
		return false
	}
	old := c.cl.version.Swap(v)
	if old != nil && old.GitVersion == v.GitVersion {
		return false
	}
	c.o.Log.Info("API server version", "gitVersion", boundName(v.GitVersion, 64))
	return true
}

// versionLoop reads the version again every c.versionEvery until ctx ends,
// asking for an evaluation when it changed.
func (c *Controller) versionLoop(ctx context.Context) {
	t := time.NewTicker(c.versionEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if c.readVersion(ctx) {
				c.kick()
			}
		}
	}
}

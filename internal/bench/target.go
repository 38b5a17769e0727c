package bench

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"syscall"
)

// checkTarget resolves the host of rawURL (an IP literal resolves without
// any network I/O) and returns an error wrapping ErrRemoteTarget unless every
// address is loopback (127.0.0.0/8, ::1) or allowRemote is set. Resolution
// errors are returned wrapped.
func checkTarget(ctx context.Context, rawURL string, allowRemote bool) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("%w: --url: %w", ErrOptions, err)
	}
	host := u.Hostname()
	if allowRemote {
		return nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("resolve %q: %w", host, err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("resolve %q: no addresses", host)
	}
	for _, a := range addrs {
		if !a.Unmap().IsLoopback() {
			return fmt.Errorf("%w: %s resolves to %s; pass --allow-remote to load a remote webhook", ErrRemoteTarget, host, a.Unmap())
		}
	}
	return nil
}

// loopbackOnly is a net.Dialer Control function that refuses to connect to
// a non-loopback address. It backs up checkTarget at connection time, so a
// name that resolves differently later (DNS rebinding, a changed hosts file)
// still cannot send load elsewhere.
func loopbackOnly(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot parse dial address %q: %w", ErrRemoteTarget, address, err)
	}
	if !ap.Addr().Unmap().IsLoopback() {
		return fmt.Errorf("%w: refusing to dial %s", ErrRemoteTarget, address)
	}
	return nil
}

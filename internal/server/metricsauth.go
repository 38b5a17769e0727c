package server

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"golang.org/x/time/rate"
)

// Metrics authentication, the way controller-runtime's
// filters.WithAuthenticationAndAuthorization (pkg/metrics/filters, v0.25.2)
// does it through k8s.io/apiserver's delegating authenticator and
// authorizer, with the same cache lifetimes, but on client-go alone: that
// library would double kadmit's binary and add 12 MiB of resident memory
// for two API calls.
const (
	tokenCacheTTL   = time.Minute
	allowCacheTTL   = 5 * time.Minute
	denyCacheTTL    = 30 * time.Second
	reviewTimeout   = 10 * time.Second
	maxCacheEntries = 1024
	// reviewRate bounds the TokenReviews of unknown tokens sent to the API
	// server: a client presenting a new token per request cannot make
	// kadmit flood the API server. sourceRate bounds them per client
	// address, so one address cannot spend the whole rate (tracked for at
	// most maxSources addresses).
	reviewRate  = 20
	reviewBurst = 40
	sourceRate  = 5
	sourceBurst = 10
	maxSources  = 1024
	// A token the API server authenticated within knownTokenTTL is known:
	// when its one-minute cache entry expires it is reviewed again without
	// waiting on the limiters above, so a flood of garbage tokens never
	// gets a real scraper a 429. At most maxCacheEntries known tokens,
	// each reviewed at most once per tokenCacheTTL: 1,024 reviews a minute
	// at worst, and only for tokens that authenticated.
	knownTokenTTL = 15 * time.Minute
	// accessRate bounds the SubjectAccessReviews, sent only for
	// authenticated users, on their own limiter: unauthenticated floods do
	// not reach it.
	accessRate  = 20
	accessBurst = 40
)

type metricsAuthorizer struct {
	client  kubernetes.Interface
	log     *slog.Logger
	th      *throttle
	lim     *rate.Limiter // TokenReviews of unknown tokens, all sources
	access  *rate.Limiter // SubjectAccessReviews
	now     func() time.Time
	limited func(scope string) // told of each 429: "source" or "global"; may be nil

	mu        sync.Mutex
	tokens    map[[sha256.Size]byte]cachedUser
	known     map[[sha256.Size]byte]time.Time // authenticated tokens, until when they are known
	sources   map[string]*sourceLimiter
	decisions map[string]cachedDecision
}

type sourceLimiter struct {
	lim  *rate.Limiter
	seen time.Time
}

type cachedUser struct {
	user    *authenticationv1.UserInfo // nil: the token was rejected
	expires time.Time
}

type cachedDecision struct {
	allowed bool
	reason  string
	expires time.Time
}

// metricsAuth wraps next so that only requests whose bearer token the API
// server authenticates (TokenReview) and authorizes for the request's verb
// on its non-resource URL (SubjectAccessReview) reach it. A missing or
// rejected token gets 401, as the API server's own WithAuthentication filter
// answers (k8s.io/apiserver/pkg/endpoints/filters/authentication.go,
// v0.37.1); an authenticated user without the permission 403; an API error
// 500; reviews of unknown tokens beyond sourceRate per second from one
// address or reviewRate in all, or access reviews beyond accessRate, 429
// (limited is told which). Answers are cached (tokens 1 min, allowed
// 5 min, denied 30 s, at most 1,024 of each).
func metricsAuth(cfg *rest.Config, log *slog.Logger, th *throttle, limited func(scope string), next http.Handler) (http.Handler, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication client: %w", err)
	}
	a := newMetricsAuthorizer(cs, log, th)
	a.limited = limited
	return a.wrap(next), nil
}

func newMetricsAuthorizer(cs kubernetes.Interface, log *slog.Logger, th *throttle) *metricsAuthorizer {
	return &metricsAuthorizer{client: cs, log: log, th: th, now: time.Now,
		lim: rate.NewLimiter(reviewRate, reviewBurst), access: rate.NewLimiter(accessRate, accessBurst),
		tokens: map[[sha256.Size]byte]cachedUser{}, known: map[[sha256.Size]byte]time.Time{},
		sources: map[string]*sourceLimiter{}, decisions: map[string]cachedDecision{}}
}

func (a *metricsAuthorizer) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		user, code, err := a.authenticate(r.Context(), remoteHost(r.RemoteAddr), token)
		if err != nil {
			a.th.log(r.Context(), a.log, slog.LevelWarn, "metrics request: authentication failed", slog.Any("error", err))
			http.Error(w, http.StatusText(code), code)
			return
		}
		if user == nil {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(r.Method)
		allowed, reason, code, err := a.authorize(r.Context(), user, verb, r.URL.Path)
		if err != nil {
			a.th.log(r.Context(), a.log, slog.LevelWarn, "metrics request: authorization failed", slog.String("user", user.Username), slog.Any("error", err))
			http.Error(w, http.StatusText(code), code)
			return
		}
		if !allowed {
			a.th.log(r.Context(), a.log, slog.LevelDebug, "metrics request forbidden", slog.String("user", user.Username), slog.String("reason", reason))
			http.Error(w, fmt.Sprintf("user %s may not %s %s", user.Username, verb, r.URL.Path), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// authenticate returns the token's user, nil for a rejected token, or an
// error with the HTTP status to answer; source is the client's address.
func (a *metricsAuthorizer) authenticate(ctx context.Context, source, token string) (*authenticationv1.UserInfo, int, error) {
	key := sha256.Sum256([]byte(token))
	now := a.now()
	a.mu.Lock()
	c, ok := a.tokens[key]
	knownUntil, known := a.known[key]
	a.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.user, 0, nil
	}
	if !known || !now.Before(knownUntil) {
		if scope, err := a.allowUnknown(source, now); err != nil {
			if a.limited != nil {
				a.limited(scope)
			}
			return nil, http.StatusTooManyRequests, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, http.StatusInternalServerError, fmt.Errorf("TokenReview: %w", err)
	}
	var user *authenticationv1.UserInfo
	if tr.Status.Authenticated {
		user = &tr.Status.User
	}
	a.mu.Lock()
	if len(a.tokens) >= maxCacheEntries {
		clear(a.tokens)
	}
	a.tokens[key] = cachedUser{user: user, expires: now.Add(tokenCacheTTL)}
	if user != nil {
		if _, ok := a.known[key]; !ok && len(a.known) >= maxCacheEntries {
			evictExpired(a.known, now)
		}
		a.known[key] = now.Add(knownTokenTTL)
	} else {
		delete(a.known, key) // revoked
	}
	a.mu.Unlock()
	return user, 0, nil
}

// allowUnknown spends one review of an unknown token from source's limiter
// and the global one, or says which is spent.
func (a *metricsAuthorizer) allowUnknown(source string, now time.Time) (string, error) {
	a.mu.Lock()
	sl, ok := a.sources[source]
	if !ok {
		if len(a.sources) >= maxSources {
			a.evictSourcesLocked(now)
		}
		sl = &sourceLimiter{lim: rate.NewLimiter(sourceRate, sourceBurst)}
		a.sources[source] = sl
	}
	sl.seen = now
	allowed := sl.lim.Allow()
	a.mu.Unlock()
	if !allowed {
		return "source", fmt.Errorf("more than %d reviews of unknown tokens per second from %s", sourceRate, source)
	}
	if !a.lim.Allow() {
		return "global", fmt.Errorf("more than %d reviews of unknown tokens per second", reviewRate)
	}
	return "", nil
}

// evictSourcesLocked drops the addresses not seen for a minute, or, if
// none, the one seen longest ago: the map stays within maxSources.
func (a *metricsAuthorizer) evictSourcesLocked(now time.Time) {
	var oldest string
	var oldestSeen time.Time
	for s, sl := range a.sources {
		if now.Sub(sl.seen) > time.Minute {
			delete(a.sources, s)
			continue
		}
		if oldest == "" || sl.seen.Before(oldestSeen) {
			oldest, oldestSeen = s, sl.seen
		}
	}
	if len(a.sources) >= maxSources {
		delete(a.sources, oldest)
	}
}

// evictExpired drops expired known tokens, or all of them if none has
// expired: the map stays within maxCacheEntries.
func evictExpired(m map[[sha256.Size]byte]time.Time, now time.Time) {
	for k, until := range m {
		if !now.Before(until) {
			delete(m, k)
		}
	}
	if len(m) >= maxCacheEntries {
		clear(m)
	}
}

func remoteHost(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

func (a *metricsAuthorizer) authorize(ctx context.Context, u *authenticationv1.UserInfo, verb, path string) (bool, string, int, error) {
	key := strings.Join([]string{u.Username, u.UID, strings.Join(u.Groups, ","), verb, path}, "\x00")
	now := a.now()
	a.mu.Lock()
	c, ok := a.decisions[key]
	a.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.allowed, c.reason, 0, nil
	}
	if !a.access.Allow() {
		if a.limited != nil {
			a.limited("global")
		}
		return false, "", http.StatusTooManyRequests, fmt.Errorf("more than %d access reviews per second", accessRate)
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	sar, err := a.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
		}}, metav1.CreateOptions{})
	if err != nil {
		return false, "", http.StatusInternalServerError, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	ttl := denyCacheTTL
	if sar.Status.Allowed {
		ttl = allowCacheTTL
	}
	a.mu.Lock()
	if len(a.decisions) >= maxCacheEntries {
		clear(a.decisions)
	}
	a.decisions[key] = cachedDecision{allowed: sar.Status.Allowed, reason: sar.Status.Reason, expires: now.Add(ttl)}
	a.mu.Unlock()
	return sar.Status.Allowed, sar.Status.Reason, 0, nil
}

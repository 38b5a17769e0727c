package server

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
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
	// reviewRate bounds the TokenReviews and SubjectAccessReviews sent to
	// the API server on cache misses: a client presenting a new token per
	// request cannot make kadmit flood the API server.
	reviewRate  = 20
	reviewBurst = 40
)

type metricsAuthorizer struct {
	client kubernetes.Interface
	log    *slog.Logger
	th     *throttle
	lim    *rate.Limiter
	now    func() time.Time

	mu        sync.Mutex
	tokens    map[[sha256.Size]byte]cachedUser
	decisions map[string]cachedDecision
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
// 500; reviews beyond reviewRate per second 429. Answers are cached
// (tokens 1 min, allowed 5 min, denied 30 s, at most 1,024 of each).
func metricsAuth(cfg *rest.Config, log *slog.Logger, th *throttle, next http.Handler) (http.Handler, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication client: %w", err)
	}
	return newMetricsAuthorizer(cs, log, th).wrap(next), nil
}

func newMetricsAuthorizer(cs kubernetes.Interface, log *slog.Logger, th *throttle) *metricsAuthorizer {
	return &metricsAuthorizer{client: cs, log: log, th: th, lim: rate.NewLimiter(reviewRate, reviewBurst), now: time.Now,
		tokens: map[[sha256.Size]byte]cachedUser{}, decisions: map[string]cachedDecision{}}
}

func (a *metricsAuthorizer) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		user, code, err := a.authenticate(r.Context(), token)
		if err != nil {
			a.th.log(a.log, slog.LevelWarn, "metrics request: authentication failed", slog.Any("error", err))
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
			a.th.log(a.log, slog.LevelWarn, "metrics request: authorization failed", slog.String("user", user.Username), slog.Any("error", err))
			http.Error(w, http.StatusText(code), code)
			return
		}
		if !allowed {
			a.th.log(a.log, slog.LevelDebug, "metrics request forbidden", slog.String("user", user.Username), slog.String("reason", reason))
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
// error with the HTTP status to answer.
func (a *metricsAuthorizer) authenticate(ctx context.Context, token string) (*authenticationv1.UserInfo, int, error) {
	key := sha256.Sum256([]byte(token))
	now := a.now()
	a.mu.Lock()
	c, ok := a.tokens[key]
	a.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.user, 0, nil
	}
	if !a.lim.Allow() {
		return nil, http.StatusTooManyRequests, fmt.Errorf("more than %d token and access reviews per second", reviewRate)
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
	a.mu.Unlock()
	return user, 0, nil
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
	if !a.lim.Allow() {
		return false, "", http.StatusTooManyRequests, fmt.Errorf("more than %d token and access reviews per second", reviewRate)
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

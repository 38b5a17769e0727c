package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	utilwait "k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	authenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
)

// metricsAuth wraps next so that only requests whose bearer token the API
// server authenticates (TokenReview) and authorizes for the request's verb
// on its non-resource URL (SubjectAccessReview) reach it. The delegating
// authenticator and authorizer of k8s.io/apiserver cache answers (1 min;
// allowed 5 min, denied 30 s) and retry with backoff, as
// controller-runtime's metrics filters.WithAuthenticationAndAuthorization
// (pkg/metrics/filters/filters.go, v0.25.2) configures them. Unlike that
// filter, a token the API server rejects is answered 401, not 500, as the
// API server's own WithAuthentication filter does
// (k8s.io/apiserver/pkg/endpoints/filters/authentication.go, v0.37.1): a
// bad token is the client's fault, and scrapers alert on 5xx.
func metricsAuth(cfg *rest.Config, log *slog.Logger, th *throttle, next http.Handler) (http.Handler, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication client: %w", err)
	}
	authn, err := authenticationv1.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication client: %w", err)
	}
	authz, err := authorizationv1.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("metrics authorization client: %w", err)
	}
	backoff := &utilwait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	authenticator, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: false},
		CacheTTL:                 time.Minute,
		TokenAccessReviewClient:  authn,
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authenticator: %w", err)
	}
	authorizerImpl, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: authz,
		AllowCacheTTL:             5 * time.Minute,
		DenyCacheTTL:              30 * time.Second,
		WebhookRetryBackoff:       backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authorizer: %w", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, ok, err := authenticator.AuthenticateRequest(r)
		if err != nil || !ok {
			if err != nil {
				th.log(log, slog.LevelDebug, "metrics request not authenticated", slog.Any("error", err))
			}
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		attrs := authorizer.AttributesRecord{User: res.User, Verb: strings.ToLower(r.Method), Path: r.URL.Path}
		decision, reason, err := authorizerImpl.Authorize(r.Context(), attrs)
		if err != nil {
			th.log(log, slog.LevelWarn, "metrics authorization failed", slog.String("user", res.User.GetName()), slog.Any("error", err))
			http.Error(w, "authorization failed", http.StatusInternalServerError)
			return
		}
		if decision != authorizer.DecisionAllow {
			th.log(log, slog.LevelDebug, "metrics request forbidden", slog.String("user", res.User.GetName()), slog.String("reason", reason))
			http.Error(w, fmt.Sprintf("user %s may not %s %s", res.User.GetName(), attrs.Verb, attrs.Path), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	}), nil
}

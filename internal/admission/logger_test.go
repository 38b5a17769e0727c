package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"

	"github.com/kadmit/kadmit/internal/logging"
)

// TestPolicyLogsThroughRequestLogger: a policy's context carries the
// review's logger, HandlerOptions.Logger with the webhook path and the
// request's uid; with no Logger, FromContext still gives a usable one.
func TestPolicyLogsThroughRequestLogger(t *testing.T) {
	var buf bytes.Buffer
	base := slog.New(slog.NewJSONHandler(&buf, nil))
	logs := func(ctx context.Context, _ *Request) Verdict {
		logging.FromContext(ctx).Info("policy says", "k", "v")
		return Allow()
	}
	w, _ := post(t, NewHandler(validating(logs), HandlerOptions{Logger: base}), "application/json", reviewBody(APIVersionV1, "uid-42", podJSON))
	if w.Code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", w.Code, w.Body.String())
	}
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("log %q: %v", buf.String(), err)
	}
	if line["webhook"] != "/validate" || line["uid"] != "uid-42" || line["msg"] != "policy says" || line["k"] != "v" {
		t.Fatalf("policy's line = %v, want webhook=/validate uid=uid-42", line)
	}

	var got *slog.Logger
	w, _ = post(t, NewHandler(validating(func(ctx context.Context, _ *Request) Verdict {
		got = logging.FromContext(ctx)
		return Allow()
	}), HandlerOptions{}), "application/json", reviewBody(APIVersionV1, "u", podJSON))
	if w.Code != http.StatusOK || got == nil {
		t.Fatalf("HTTP %d, logger %v: want 200 and a logger without HandlerOptions.Logger", w.Code, got)
	}
}

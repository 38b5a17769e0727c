package doctor

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// KD203: when a webhook pod is deleted (rollout, node drain, scale-down),
// the kubelet runs its preStop hook and then sends SIGTERM, while the
// pod's removal from the EndpointSlices travels on its own: the endpoint
// controller's update, then kube-proxy's next sync (and, with
// --enable-aggregator-routing, the API server's own EndpointSlice
// informer): about a second on a quiet cluster, several on a busy one.
// Meanwhile the API server keeps calling the pod, and keeps reusing the
// keep-alive connections it pooled to it even after the endpoint is gone
// (kubernetes/kubernetes#127335, open). A server that stops at SIGTERM
// fails those calls (connection refused, EOF, connection reset by peer).

// MinPreStopDelay is the shortest preStop delay KD203 accepts: above
// endpoint propagation on a busy control plane (KEP-3960, the preStop
// sleep action, was made for exactly this delay; kadmit's chart uses 10 s).
const MinPreStopDelay = 5 * time.Second

// suggestedPreStopSleep is the delay KD203's fix adds (kadmit's chart's
// preStopSleepSeconds), and suggestedShutdownGrace what it leaves the
// server after it: the kubelet's default terminationGracePeriodSeconds.
const (
	suggestedPreStopSleep  = 10
	suggestedShutdownGrace = 30
)

// termSpec is the pod spec of one workload behind the webhook's Service:
// its template when doctor read it, else a live pod's spec.
type termSpec struct {
	workload WorkloadRef
	spec     *corev1.PodSpec
	// patchable: spec is the workload's template (a JSON patch on
	// /spec/template/spec applies); false for a bare pod's own spec.
	patchable bool
}

// checkTermination runs KD203 for a Service webhook: for each workload
// behind the Service, the container serving the target port must delay
// its shutdown (a preStop sleep, or an exec preStop that sleeps, or
// kadmit serve's --shutdown-drain) by at least MinPreStopDelay and less
// than terminationGracePeriodSeconds. Warning for a Fail webhook, info
// for Ignore (failed calls are admitted without the webhook, silently);
// one step lower when doctor cannot read the delay (an exec or httpGet
// hook that does not visibly sleep). A single ready endpoint is KD604's.
func (r *run) checkTermination(w *Webhook) []Finding {
	b := r.backends[w.ServiceKey()]
	if b == nil || b.Service == nil {
		return nil
	}
	var sp *corev1.ServicePort
	for i := range b.Service.Spec.Ports {
		if b.Service.Spec.Ports[i].Port == w.ServicePort() {
			sp = &b.Service.Spec.Ports[i]
		}
	}
	if sp == nil {
		return nil // KD102
	}
	var out []Finding
	for _, ts := range termSpecs(b) {
		if f, ok := terminationFinding(w, b, sp, ts); ok {
			out = append(out, f)
		}
	}
	return out
}

// termSpecs lists one spec per workload behind the Service, in pod order
// then template order.
func termSpecs(b *Backend) []termSpec {
	var out []termSpec
	seen := map[WorkloadRef]bool{}
	for _, p := range b.Pods {
		ref := b.Workload[p.Name]
		if seen[ref] {
			continue
		}
		seen[ref] = true
		if spec := b.templateOf(ref); spec != nil {
			out = append(out, termSpec{workload: ref, spec: spec, patchable: true})
		} else {
			out = append(out, termSpec{workload: ref, spec: &p.Spec})
		}
	}
	for i := range b.Templates {
		t := &b.Templates[i]
		if !seen[t.Workload] {
			seen[t.Workload] = true
			out = append(out, termSpec{workload: t.Workload, spec: &t.Spec, patchable: t.Workload.Kind != "Pod"})
		}
	}
	return out
}

// templateOf is the pod template spec of a workload doctor read, or nil.
func (b *Backend) templateOf(ref WorkloadRef) *corev1.PodSpec {
	switch ref.Kind {
	case "Deployment":
		if d := b.Deployments[ref.Name]; d != nil {
			return &d.Spec.Template.Spec
		}
	case "ReplicaSet":
		if rs := b.ReplicaSets[ref.Name]; rs != nil {
			return &rs.Spec.Template.Spec
		}
	case "StatefulSet":
		for i := range b.StatefulSets {
			if b.StatefulSets[i].Name == ref.Name {
				return &b.StatefulSets[i].Spec.Template.Spec
			}
		}
	case "DaemonSet":
		for i := range b.DaemonSets {
			if b.DaemonSets[i].Name == ref.Name {
				return &b.DaemonSets[i].Spec.Template.Spec
			}
		}
	}
	return nil
}

// servingContainers are the indexes of the containers that declare the
// Service port's targetPort; when none does, every container (sure is then
// false unless there is only one).
func servingContainers(sp *corev1.ServicePort, spec *corev1.PodSpec) (idx []int, sure bool) {
	tp := sp.TargetPort
	if tp.Type == intstr.Int && tp.IntVal == 0 {
		tp = intstr.FromInt32(sp.Port)
	}
	for i, c := range spec.Containers {
		for _, p := range c.Ports {
			if (tp.Type == intstr.Int && p.ContainerPort == tp.IntVal) || (tp.Type == intstr.String && p.Name == tp.StrVal) {
				idx = append(idx, i)
				break
			}
		}
	}
	if len(idx) > 0 {
		return idx, true
	}
	for i := range spec.Containers {
		idx = append(idx, i)
	}
	return idx, len(idx) == 1
}

// shutdownDelay is how long container c keeps serving after its pod is
// marked for deletion: its preStop sleep (the sleep action, or an exec
// hook whose command sleeps), plus kadmit serve's --shutdown-drain (it
// keeps accepting and answering that long after SIGTERM). how describes
// it; known is false for a hook doctor cannot time (httpGet, or exec
// without a visible sleep).
func shutdownDelay(c *corev1.Container) (d time.Duration, how string, known bool) {
	known = true
	var parts []string
	if l := c.Lifecycle; l != nil && l.PreStop != nil {
		switch h := l.PreStop; {
		case h.Sleep != nil:
			d += time.Duration(h.Sleep.Seconds) * time.Second
			parts = append(parts, fmt.Sprintf("preStop sleep %ds", h.Sleep.Seconds))
		case h.Exec != nil:
			if s, ok := execSleep(h.Exec.Command); ok {
				d += s
				parts = append(parts, fmt.Sprintf("preStop exec sleeping %s", s))
			} else {
				known = false
				parts = append(parts, fmt.Sprintf("preStop exec %q", truncate(strings.Join(h.Exec.Command, " "), 80)))
			}
		default:
			known = false
			parts = append(parts, "a preStop hook doctor cannot time (httpGet or tcpSocket)")
		}
	}
	if dr, ok := kadmitDrain(c); ok {
		d += dr
		parts = append(parts, fmt.Sprintf("kadmit serve --shutdown-drain=%s", dr))
	}
	return d, strings.Join(parts, " + "), known
}

// sleepRE finds a sleep in an exec hook's command: "sleep 10",
// "/bin/sleep 10", "sh -c 'sleep 5 && nginx -s quit'", "/manager sleep 10",
// with an optional s or m unit (coreutils' sleep).
var sleepRE = regexp.MustCompile(`(?:^|[\s;&|(/])sleep\s+(\d+(?:\.\d+)?)([sm]?)(?:$|[\s;&|)])`)

// execSleep is the longest sleep in an exec hook's command.
func execSleep(cmd []string) (time.Duration, bool) {
	var best time.Duration
	found := false
	for _, m := range sleepRE.FindAllStringSubmatch(strings.Join(cmd, " "), -1) {
		f, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			continue
		}
		unit := time.Second
		if m[2] == "m" {
			unit = time.Minute
		}
		if d := time.Duration(f * float64(unit)); !found || d > best {
			best, found = d, true
		}
	}
	return best, found
}

// kadmitDrain reads kadmit serve's --shutdown-drain from a container's
// command and args.
func kadmitDrain(c *corev1.Container) (time.Duration, bool) {
	args := append(append([]string(nil), c.Command...), c.Args...)
	if !containsWord(args, "serve") {
		return 0, false
	}
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--shutdown-drain=")
		if !ok && a == "--shutdown-drain" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			if d, err := time.ParseDuration(v); err == nil && d > 0 {
				return d, true
			}
		}
	}
	return 0, false
}

func containsWord(args []string, w string) bool {
	for _, a := range args {
		if a == w {
			return true
		}
	}
	return false
}

// truncate bounds s (an object's field, shown in a finding) to n bytes.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// terminationFinding is KD203 for one workload, if its serving container
// does not delay its shutdown enough.
func terminationFinding(w *Webhook, b *Backend, sp *corev1.ServicePort, ts termSpec) (Finding, bool) {
	idx, sure := servingContainers(sp, ts.spec)
	if len(idx) == 0 {
		return Finding{}, false
	}
	grace := time.Duration(corev1.DefaultTerminationGracePeriodSeconds) * time.Second
	if g := ts.spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	type problem struct {
		i          int
		delay      time.Duration
		how, issue string
		known      bool
	}
	var probs []problem
	for _, i := range idx {
		c := &ts.spec.Containers[i]
		d, how, known := shutdownDelay(c)
		var issue string
		switch {
		case !known:
			issue = fmt.Sprintf("has %s, which may or may not delay its shutdown", how)
		case d == 0:
			issue = "has no preStop delay: it stops serving at SIGTERM"
		case d < MinPreStopDelay:
			issue = fmt.Sprintf("delays its shutdown by only %s (%s), less than the %s endpoint removal may take", d, how, MinPreStopDelay)
		case d >= grace:
			issue = fmt.Sprintf("delays its shutdown by %s (%s), not less than terminationGracePeriodSeconds (%s): the kubelet kills it before it has finished", d, how, grace)
		default:
			continue // this container is fine
		}
		probs = append(probs, problem{i: i, delay: d, how: how, issue: issue, known: known})
	}
	// When doctor cannot tell which container serves the port, it speaks
	// only if none of them is fine.
	if len(probs) == 0 || len(probs) < len(idx) {
		return Finding{}, false
	}
	p := probs[0]
	c := &ts.spec.Containers[p.i]
	var unsure []string
	if !sure {
		unsure = append(unsure, fmt.Sprintf("no container of %s declares the Service's targetPort %s, so it is not known which one serves it", ts.workload, sp.TargetPort.String()))
	}
	if !p.known {
		unsure = append(unsure, "the hook's duration cannot be read from the pod spec")
	}
	what := fmt.Sprintf("Container %q of %s (behind Service %s/%s, port %d) %s.", c.Name, ts.workload, b.Namespace, b.Name, sp.Port, p.issue)
	sev := SeverityWarning
	consequenceText := "failurePolicy is Fail, so those calls reject the requests they were for: every rollout, node drain or scale-down of the webhook fails some API requests (\"failed calling webhook ... EOF\", \"connection reset by peer\", \"connection refused\")."
	if !w.Fail() {
		sev = SeverityInfo
		consequenceText = "failurePolicy is Ignore, so those requests are admitted without the webhook: on every rollout or node drain its policy is silently skipped for some requests."
	}
	if len(unsure) > 0 {
		what = cannotTell(what, unsure)
		sev = lower(sev)
	}
	why := "When a webhook pod is deleted, the kubelet runs its preStop hook and then sends SIGTERM, while its removal from the EndpointSlices still has to reach kube-proxy and the API server (about a second on a quiet cluster, several seconds on a busy one). Meanwhile the API server keeps calling the pod, and keeps reusing the keep-alive connections it pooled to it even after the endpoint is gone (kubernetes/kubernetes#127335). A pod that stops serving at SIGTERM fails those calls; " + consequenceText +
		" A preStop sleep keeps it serving until routing has moved; the server should also close connections after answering (Connection: close) once it got SIGTERM, and exit well within terminationGracePeriodSeconds, which counts the preStop hook too."
	if w.Fail() {
		why += " (With a single ready endpoint every restart is an outage anyway: " + IDSingleReplica + ".)"
	}
	return Finding{ID: IDNoDrainOnTermination, Severity: sev, What: what, Why: why, Fix: terminationFix(b, ts, p.i, p.delay, p.known, grace)}, true
}

// terminationFix is the JSON patch on the workload's pod template that
// gives the container a preStop sleep (replacing its preStop hook) and a
// grace period leaving the server suggestedShutdownGrace after it; or,
// when only the grace period is short, that grace period alone.
func terminationFix(b *Backend, ts termSpec, i int, delay time.Duration, known bool, grace time.Duration) string {
	c := &ts.spec.Containers[i]
	base := fmt.Sprintf("/spec/template/spec/containers/%d", i)
	var ops []map[string]any
	sleep := suggestedPreStopSleep
	tooLong := known && delay >= grace
	if !tooLong {
		if c.Lifecycle == nil {
			ops = append(ops, map[string]any{"op": "add", "path": base + "/lifecycle", "value": map[string]any{"preStop": map[string]any{"sleep": map[string]any{"seconds": sleep}}}})
		} else {
			ops = append(ops, map[string]any{"op": "add", "path": base + "/lifecycle/preStop", "value": map[string]any{"sleep": map[string]any{"seconds": sleep}}})
		}
		delay = time.Duration(sleep) * time.Second
	}
	need := int64(delay/time.Second) + suggestedShutdownGrace
	if int64(grace/time.Second) < need {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/template/spec/terminationGracePeriodSeconds", "value": need})
	}
	note := ""
	if !known {
		note = "  # replaces the existing preStop hook: keep what it does after the sleep if it matters (an exec hook: sleep 10 first)"
	}
	if !ts.patchable {
		return fmt.Sprintf("Recreate %s with lifecycle.preStop.sleep.seconds: %d on container %q and terminationGracePeriodSeconds >= %d (a running pod's lifecycle cannot be changed); better, run it from a Deployment.", ts.workload, sleep, c.Name, need)
	}
	data, _ := json.Marshal(ops) // maps of strings and numbers always encode
	return fmt.Sprintf("kubectl -n %s patch %s %s --type=json -p '%s'%s  # the sleep action needs Kubernetes 1.30+, and no shell in the image; if a chart or operator owns %s, set it there", b.Namespace, strings.ToLower(ts.workload.Kind), ts.workload.Name, data, note, ts.workload)
}

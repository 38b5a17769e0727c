package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/cmdexit"
	"github.com/kadmit/kadmit/internal/review"
	"github.com/kadmit/kadmit/internal/served"
)

func newReviewCmd() *cobra.Command {
	var file, configFile, operation, oldFile, subresource, output, state, user, uid string
	var policyPaths, groups []string
	var allowSensitive, defaults bool
	cmd := &cobra.Command{
		Use:   "review -f FILE|DIR|-",
		Short: "Run manifests through kadmit's policies offline",
		Long: `Run each object through the same webhooks kadmit serve runs: every matching
mutating webhook in order, then every validating webhook on the mutated object.

With --state, the policies that read cluster state (LocalQueues, quotas,
pods, namespaces) read it from the given manifests, through the same informer
caches kadmit serve fills from the API server; without it they skip those
checks with a warning. The declared policies (--policies) read the state's
namespaces for namespaceSelector and namespaceObject, as kadmit serve reads
its namespace cache; a namespace the state does not hold (or every one,
without --state) has only the label kubernetes.io/metadata.name.

Each object is reviewed as a request of the user --user (default
kadmit-review) with exactly the groups --group and the uid --uid (kubectl's
--as, --as-group and --as-uid; nothing is added, not even
system:authenticated): what request.userInfo holds for declared policies
and the webhooks' userInfo for built-in ones.

A CREATE of an object with metadata.generateName and no name is reviewed as
the API server handles it: the mutating webhooks see no name, then the name
is generated (generateName cut to 58 characters plus 5 random ones) and the
validating webhooks see it in request.name and object.metadata.name; the
result (and -o json's name and object) carries it, a new one each run.

Exit status: 0 when every object is allowed, 1 when any is denied, 2 on usage
or input errors.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return cmdexit.New(2, errors.New("-f is required"))
			}
			if output != "text" && output != "json" {
				return cmdexit.New(2, fmt.Errorf("-o %q: must be text or json", output))
			}
			cfg := builtin.Config.Default()
			var err error
			if configFile != "" {
				if cfg, err = builtin.Config.LoadFile(configFile); err != nil {
					return cmdexit.New(2, err)
				}
			}
			src := served.Sources{Config: cfg}
			if len(policyPaths) > 0 {
				src.Declared = &served.Declared{Paths: policyPaths, Load: celpolicy.LoadOptions{AllowSensitiveGroups: allowSensitive}}
			}
			if state != "" {
				ctx, cancel := context.WithCancel(cmd.Context())
				defer cancel() // stops the state's informers
				src.Cluster = func(reads []clustercache.Read) (*clustercache.Caches, error) {
					return review.LoadState(ctx, state, reads)
				}
			} // else offline: no cluster caches
			policies, err := served.Assemble(src)
			if err != nil {
				return cmdexit.New(2, err)
			}
			webhooks, err := policies.Webhooks()
			if err != nil {
				return cmdexit.New(2, err)
			}
			docs, err := review.Read(file, cmd.InOrStdin())
			if err != nil {
				return cmdexit.New(2, err)
			}
			opts := review.Options{Operation: admissionv1.Operation(strings.ToUpper(operation)), SubResource: subresource, Defaults: defaults}
			if user == "" && (len(groups) > 0 || uid != "") {
				return cmdexit.New(2, errors.New("--group and --uid need --user"))
			}
			opts.UserInfo = authenticationv1.UserInfo{Username: user, UID: uid, Groups: groups}
			switch opts.Operation {
			case admissionv1.Create, admissionv1.Update, admissionv1.Delete, admissionv1.Connect:
			default:
				return cmdexit.New(2, fmt.Errorf("--operation %q: must be CREATE, UPDATE, DELETE or CONNECT", operation))
			}
			if oldFile != "" {
				if opts.Old, err = review.Read(oldFile, nil); err != nil {
					return cmdexit.New(2, err)
				}
			}
			return runReview(cmd.Context(), cmd.OutOrStdout(), webhooks, docs, opts, output)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "filename", "f", "", `manifest file, directory or "-" for stdin`)
	f.StringVar(&configFile, "config", "", "configuration file; default: the seed profile")
	f.StringVar(&operation, "operation", "CREATE", "operation to review as: CREATE, UPDATE, DELETE or CONNECT")
	f.StringVar(&oldFile, "old", "", "old objects for UPDATE/DELETE, matched by kind, namespace and name")
	f.StringVar(&subresource, "subresource", "", `subresource to review as, e.g. "status"`)
	f.BoolVar(&allowSensitive, "policies-allow-sensitive-groups", false, "let --policies match resources of the rbac.authorization.k8s.io, admissionregistration.k8s.io, certificates.k8s.io, authentication.k8s.io and authorization.k8s.io groups, refused by default as kadmit serve refuses them (docs/security.md)")
	f.StringArrayVar(&policyPaths, "policies", nil, "ValidatingAdmissionPolicy / MutatingAdmissionPolicy files or directories (with bindings and params) to run next to the built-in policies; repeatable")
	f.BoolVar(&defaults, "defaults", false, "hand the policies each object as the API server would: with the API's defaults (core, apps, batch v1) and the ServiceAccount, TaintNodesByCondition, Priority, DefaultTolerationSeconds and StorageObjectInUseProtection admission plugins applied first, and each webhook's result defaulted (docs/policies-cel.md)")
	f.StringVarP(&output, "output", "o", "text", "output: text or json (one JSON object per line)")
	f.StringVar(&user, "user", "", "username the objects are reviewed as (request.userInfo.username); default "+review.DefaultUser)
	f.StringArrayVar(&groups, "group", nil, "group of --user (request.userInfo.groups), exactly as given; repeatable")
	f.StringVar(&uid, "uid", "", "uid of --user (request.userInfo.uid)")
	f.StringVar(&state, "state", "", "cluster state (file or directory of manifests: LocalQueues, ElasticQuotas, pods, namespaces ...) that stateful checks read")
	return cmd
}

func runReview(ctx context.Context, w io.Writer, webhooks []*admission.Webhook, docs []review.Document, opts review.Options, output string) error {
	denied := 0
	for _, d := range docs {
		res, err := review.Run(ctx, webhooks, d, opts)
		if err != nil {
			return cmdexit.New(2, err)
		}
		if !res.Allowed {
			denied++
		}
		if err := review.Print(w, res, output); err != nil {
			return cmdexit.New(2, err)
		}
	}
	if denied > 0 {
		return cmdexit.New(1, fmt.Errorf("%d of %d objects denied", denied, len(docs)))
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/cmdexit"
	"github.com/kadmit/kadmit/internal/kubeconfig"
	"github.com/kadmit/kadmit/internal/policysuite"
)

func newTestCmd() *cobra.Command {
	var (
		allowSensitive, server, defaults bool
		output, junit                    string
		kubeconfigPath, kubeContext      string
		serverWait                       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "test DIR|FILE",
		Short: "Run test suites for ValidatingAdmissionPolicy / MutatingAdmissionPolicy files",
		Long: `Run every test suite (kind: PolicyTest, apiVersion: kadmit.io/v1alpha1) found
under DIR: each test's object goes through the suite's mutating policies, then its
validating policies, as the API server evaluates them in tree, and the decision,
code, message, warnings, audit annotations and mutated fields are compared with
what the test expects. The format is in docs/policies-cel.md.

-o json writes one go test -json event per line instead of the text
report; --junit FILE also writes a JUnit XML report (both in
docs/policies-cel.md).

With --server, each test also runs as a server-side dry run (dryRun=All)
against the API server of --kubeconfig/--context, with the suite's policies,
bindings, params and namespaces installed for the suite's run and removed
after, and every test whose offline and server outcomes differ is reported
(DIFF lines; a failure in the JSON and JUnit reports). Use a disposable
cluster: kadmit refuses to overwrite an object of the same name. Audit
annotations cannot be read by a client and are not compared.

Exit status: 0 when every test passes (and agrees with the server), 1 when
any fails or differs, 2 on input errors or when the server run fails.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return cmdexit.New(2, fmt.Errorf("--output %q: must be text or json", output))
			}
			files, err := policysuite.Find(args[0])
			if err != nil {
				return cmdexit.New(2, err)
			}
			if len(files) == 0 {
				return cmdexit.New(2, fmt.Errorf("no test suites (kind: %s) under %s", policysuite.Kind, args[0]))
			}
			load := celpolicy.LoadOptions{AllowSensitiveGroups: allowSensitive}
			run := func(ctx context.Context, s *policysuite.Suite) ([]policysuite.Result, error) {
				return policysuite.RunWith(ctx, s, load)
			}
			if !server {
				for _, f := range []string{"kubeconfig", "context", "server-wait"} {
					if cmd.Flags().Changed(f) {
						return cmdexit.New(2, fmt.Errorf("--%s needs --server", f))
					}
				}
			} else {
				rc, err := kubeconfig.Load(kubeconfigPath, kubeContext, "kadmit-test")
				if err != nil {
					return cmdexit.New(2, err)
				}
				sv, err := policysuite.NewServer(rc, policysuite.ServerOptions{Load: load, ReadyTimeout: serverWait, Log: cmd.ErrOrStderr()})
				if err != nil {
					return cmdexit.New(2, err)
				}
				defer func() {
					if err := sv.Close(context.WithoutCancel(cmd.Context())); err != nil {
						fmt.Fprintln(cmd.ErrOrStderr(), "kadmit test --server: cleanup:", err)
					}
				}()
				run = sv.RunServer
			}
			// report writes results on stdout in the chosen format and
			// the JUnit file, if asked for: after the last suite, or after
			// a suite whose server run failed (its results stand).
			report := func(results []policysuite.Result) error {
				if output == "text" {
					policysuite.Print(cmd.OutOrStdout(), results)
				}
				// After the report on stdout, so a report file that cannot
				// be written still leaves the results in the log.
				if junit != "" {
					if err := policysuite.WriteJUnitFile(junit, results); err != nil {
						return cmdexit.New(2, err)
					}
				}
				return nil
			}
			var results []policysuite.Result
			for _, f := range files {
				s, err := policysuite.ReadSuite(f)
				if err != nil {
					return cmdexit.New(2, err)
				}
				s.Defaults = s.Defaults || defaults
				rs, runErr := run(cmd.Context(), s)
				results = append(results, rs...)
				// Each suite's events as soon as it ran: a CI log shows
				// progress, and a later suite's input error keeps them.
				if output == "json" && len(rs) > 0 {
					if err := policysuite.WriteJSON(cmd.OutOrStdout(), rs); err != nil {
						return cmdexit.New(2, err)
					}
				}
				if runErr != nil {
					// A cleanup that failed after the suite ran: its
					// results stand, the error follows them.
					if len(results) > 0 {
						if err := report(results); err != nil {
							return err
						}
					}
					return cmdexit.New(2, runErr)
				}
			}
			if err := report(results); err != nil {
				return err
			}
			for _, r := range results {
				if !r.Passed() {
					return cmdexit.New(1, errors.New("some policy tests failed or differ from the API server"))
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&allowSensitive, "policies-allow-sensitive-groups", false, "let the suites' policies match resources of the rbac.authorization.k8s.io, admissionregistration.k8s.io, certificates.k8s.io, authentication.k8s.io and authorization.k8s.io groups, refused by default as kadmit serve refuses them (docs/security.md)")
	f.StringVarP(&output, "output", "o", "text", "report on stdout: text, or json (one go test -json event per line: start, run, output, pass/fail per test, pass/fail per suite)")
	f.StringVar(&junit, "junit", "", "also write a JUnit XML report to this file (its directory must exist; an existing file is replaced whole, a symlink or non-regular file there is an error)")
	f.BoolVar(&server, "server", false, "also send each test as a server-side dry run to the API server of --kubeconfig/--context, with the suite's policies installed there for its run, and report every test whose offline and server outcomes differ (use a disposable cluster; docs/policies-cel.md)")
	f.StringVar(&kubeconfigPath, "kubeconfig", "", "with --server: kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&kubeContext, "context", "", "with --server: kubeconfig context (default: the current context)")
	f.DurationVar(&serverWait, "server-wait", policysuite.DefaultReadyTimeout, "with --server: how long to wait, per suite, until the API server enforces the installed policies")
	f.BoolVar(&defaults, "defaults", false, "hand the policies every test's objects as the API server would, as a suite's defaults: true does: with the API's defaults (core, apps, batch v1) and the ServiceAccount, TaintNodesByCondition, Priority, DefaultTolerationSeconds and StorageObjectInUseProtection admission plugins applied first, and each mutating policy's result defaulted (docs/policies-cel.md)")
	return cmd
}

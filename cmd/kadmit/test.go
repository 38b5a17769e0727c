package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/celtest"
	"github.com/kadmit/kadmit/internal/cmdexit"
)

func newTestCmd() *cobra.Command {
	var (
		allowSensitive bool
		output, junit  string
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

Exit status: 0 when every test passes, 1 when any fails, 2 on input errors.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return cmdexit.New(2, fmt.Errorf("--output %q: must be text or json", output))
			}
			files, err := celtest.Find(args[0])
			if err != nil {
				return cmdexit.New(2, err)
			}
			if len(files) == 0 {
				return cmdexit.New(2, fmt.Errorf("no test suites (kind: %s) under %s", celtest.Kind, args[0]))
			}
			var results []celtest.Result
			for _, f := range files {
				s, err := celtest.ReadSuite(f)
				if err != nil {
					return cmdexit.New(2, err)
				}
				rs, err := celtest.RunWith(cmd.Context(), s, celpolicy.LoadOptions{AllowSensitiveGroups: allowSensitive})
				if err != nil {
					return cmdexit.New(2, err)
				}
				results = append(results, rs...)
				// Each suite's events as soon as it ran: a CI log shows
				// progress, and a later suite's input error keeps them.
				if output == "json" {
					if err := celtest.WriteJSON(cmd.OutOrStdout(), rs); err != nil {
						return cmdexit.New(2, err)
					}
				}
			}
			failed := 0
			for _, r := range results {
				if len(r.Failures) > 0 {
					failed++
				}
			}
			if output == "text" {
				celtest.Print(cmd.OutOrStdout(), results)
			}
			// After the report on stdout, so a report file that cannot be
			// written still leaves the results in the log.
			if junit != "" {
				if err := celtest.WriteJUnitFile(junit, results); err != nil {
					return cmdexit.New(2, err)
				}
			}
			if failed > 0 {
				return cmdexit.New(1, errors.New("some policy tests failed"))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&allowSensitive, "policies-allow-sensitive-groups", false, "let the suites' policies match resources of the rbac.authorization.k8s.io, admissionregistration.k8s.io, certificates.k8s.io, authentication.k8s.io and authorization.k8s.io groups, refused by default as kadmit serve refuses them (docs/security.md)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "report on stdout: text, or json (one go test -json event per line: start, run, output, pass/fail per test, pass/fail per suite)")
	cmd.Flags().StringVar(&junit, "junit", "", "also write a JUnit XML report to this file (its directory must exist; an existing file is replaced whole, a symlink or non-regular file there is an error)")
	return cmd
}

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
	var allowSensitive, defaults bool
	cmd := &cobra.Command{
		Use:   "test DIR|FILE",
		Short: "Run test suites for ValidatingAdmissionPolicy / MutatingAdmissionPolicy files",
		Long: `Run every test suite (kind: PolicyTest, apiVersion: kadmit.io/v1alpha1) found
under DIR: each test's object goes through the suite's mutating policies, then its
validating policies, as the API server evaluates them in tree, and the decision,
code, message, warnings, audit annotations and mutated fields are compared with
what the test expects. The format is in docs/policies-cel.md.

Exit status: 0 when every test passes, 1 when any fails, 2 on input errors.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
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
				s.Defaults = s.Defaults || defaults
				rs, err := celtest.RunWith(cmd.Context(), s, celpolicy.LoadOptions{AllowSensitiveGroups: allowSensitive})
				if err != nil {
					return cmdexit.New(2, err)
				}
				results = append(results, rs...)
			}
			if failed := celtest.Print(cmd.OutOrStdout(), results); failed > 0 {
				return cmdexit.New(1, errors.New("some policy tests failed"))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&allowSensitive, "policies-allow-sensitive-groups", false, "let the suites' policies match resources of the rbac.authorization.k8s.io, admissionregistration.k8s.io, certificates.k8s.io, authentication.k8s.io and authorization.k8s.io groups, refused by default as kadmit serve refuses them (docs/security.md)")
	cmd.Flags().BoolVar(&defaults, "defaults", false, "hand the policies every test's objects as the API server would, as a suite's defaults: true does: with the API's defaults (core, apps, batch v1) and the ServiceAccount, TaintNodesByCondition, Priority, DefaultTolerationSeconds and StorageObjectInUseProtection admission plugins applied first, and each mutating policy's result defaulted (docs/policies-cel.md)")
	return cmd
}

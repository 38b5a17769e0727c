package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kadmit/kadmit/internal/cmdexit"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/internal/kubeconfig"
	"github.com/kadmit/kadmit/internal/uninstall"
)

func newUninstallCmd() *cobra.Command {
	var o uninstall.Options
	var kubeconfigPath, kubeContext, logFormat, logLevel string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove kadmit's webhook configurations so no webhook outlives its server",
		Long: `Scale kadmit's Deployment to zero, wait until none of its pods is left, then
delete the MutatingWebhookConfiguration and ValidatingWebhookConfiguration
kadmit registered, and check that they are gone.

A running kadmit re-creates deleted configurations within seconds, which is
why it is stopped first. The Helm chart runs this as a pre-delete hook; with
the plain manifests, run it before (or after) kubectl delete -k.

Exit status: 0 done, 1 failed (the error says what is left), 2 usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return cmdexit.New(2, err)
			}
			if timeout <= 0 {
				return cmdexit.New(2, fmt.Errorf("--timeout %s: must be positive", timeout))
			}
			rc, err := kubeconfig.Load(kubeconfigPath, kubeContext, "kadmit-uninstall")
			if err != nil {
				return cmdexit.New(2, err)
			}
			if o.Client, err = kubernetes.NewForConfig(rc); err != nil {
				return cmdexit.New(2, fmt.Errorf("build client: %w", err))
			}
			o.Logger = log
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			res, err := uninstall.Run(ctx, o)
			if err != nil {
				return cmdexit.New(1, err)
			}
			log.Info("uninstalled webhook configurations", "deleted", res.Deleted, "scaledDown", res.ScaledDown)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Namespace, "namespace", envOr("POD_NAMESPACE", "kadmit-system"), "kadmit's namespace")
	f.StringVar(&o.Deployment, "deployment", "kadmit", `kadmit's Deployment, scaled to zero first ("" skips scaling)`)
	f.StringVar(&o.PodSelector, "pod-selector", "", "label selector of kadmit's pods, waited for when the Deployment is gone or not named")
	f.StringVar(&o.ConfigurationName, "configuration-name", uninstall.DefaultConfigurationName, "name of kadmit's MutatingWebhookConfiguration and ValidatingWebhookConfiguration")
	f.DurationVar(&timeout, "timeout", 3*time.Minute, "bound for the whole run, including waiting for kadmit's pods to end")
	f.StringVar(&kubeconfigPath, "kubeconfig", "", "kubeconfig (default: in-cluster or $KUBECONFIG)")
	f.StringVar(&kubeContext, "context", "", "kubeconfig context")
	f.StringVar(&logFormat, "log-format", "text", "log format: json or text")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

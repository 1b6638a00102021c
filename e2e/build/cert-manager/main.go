// Command cert-manager runs upstream cert-manager's controller, cainjector or webhook for the real-cluster tier.
//
// The release's own commands (cmd/controller, cmd/cainjector, cmd/webhook in the cert-manager repository) are
// separate, untagged modules that the Go module proxy does not serve; the published module
// github.com/cert-manager/cert-manager holds every controller, issuer, injector and admission plugin they run.
// This file is only the wiring those commands do: build the controller context, start the registered control
// loops (pkg/controller.Known), the CA injector's reconcilers (pkg/controller/cainjector.RegisterAllInjectors)
// and the webhook server (internal/webhook.NewCertManagerWebhookServer). The module path sits under
// github.com/cert-manager/cert-manager, as the upstream command modules do, so that the internal packages of
// the release may be imported.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	webhookconfig "github.com/cert-manager/cert-manager/internal/apis/config/webhook"
	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"

	// Control loops and issuers register themselves (pkg/controller.Register, pkg/issuer.RegisterIssuer) when
	// imported. These are the release's default controllers for the SelfSigned and CA issuers, which are the
	// issuers the project's cert-manager overlay uses; ACME, Vault, Venafi and the ingress/gateway shims are
	// left out of this build.
	crapprover "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// The controllers this build runs, in the release's names (internal/apis/config/controller/v1alpha1/defaults.go).
var enabledControllers = []string{
	issuers.ControllerName,
	clusterissuers.ControllerName,
	crapprover.ControllerName,
	crca.CRControllerName,
	crselfsigned.CRControllerName,
	trigger.ControllerName,
	issuing.ControllerName,
	keymanager.ControllerName,
	requestmanager.ControllerName,
	readiness.ControllerName,
	revisionmanager.ControllerName,
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cert-manager controller|cainjector|webhook [flags]")
		os.Exit(2)
	}
	component := os.Args[1]
	flags := flag.NewFlagSet(component, flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig file of the identity this component runs as")
	namespace := flags.String("cluster-resource-namespace", "cert-manager", "namespace of ClusterIssuer secrets")
	securePort := flags.Int("secure-port", 0, "webhook: HTTPS port on 127.0.0.1")
	healthzPort := flags.Int("healthz-port", 0, "webhook: health port")
	tlsCert := flags.String("tls-cert-file", "", "webhook: serving certificate")
	tlsKey := flags.String("tls-private-key-file", "", "webhook: serving key")
	verbosity := flags.Int("v", 2, "log verbosity")
	_ = flags.Parse(os.Args[2:])

	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("v", fmt.Sprint(*verbosity))
	logf.InitLogs()
	log := klog.Background().WithName(component)
	ctrl.SetLogger(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, log)

	var err error
	switch component {
	case "controller":
		err = runController(ctx, log, *kubeconfig, *namespace)
	case "cainjector":
		err = runCAInjector(ctx, *kubeconfig)
	case "webhook":
		err = runWebhook(ctx, log, webhookconfig.WebhookConfiguration{
			SecurePort:  int32(*securePort),
			HealthzPort: int32(*healthzPort),
			KubeConfig:  *kubeconfig,
			// "0" turns the metrics listener off, as in the release's configuration schema.
			MetricsListenAddress: "0",
		}, *tlsCert, *tlsKey)
	default:
		err = fmt.Errorf("unknown component %q: want controller, cainjector or webhook", component)
	}
	if err != nil {
		log.Error(err, "exiting")
		os.Exit(1)
	}
}

// runController does what cmd/controller/app does without leader election (one replica): build the context
// factory, construct each enabled control loop, start the shared informers, and run until ctx ends.
func runController(ctx context.Context, log logr.Logger, kubeconfig, namespace string) error {
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: namespace},
		CertificateOptions: controller.CertificateOptions{
			// The release's defaults (internal/apis/config/controller/v1alpha1/defaults.go).
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return fmt.Errorf("building the controller context: %w", err)
	}
	var loops sync.WaitGroup
	errs := make(chan error, len(enabledControllers))
	for _, name := range enabledControllers {
		construct, ok := controller.Known()[name]
		if !ok {
			return fmt.Errorf("controller %q is not registered in this release", name)
		}
		loop, err := construct(factory)
		if err != nil {
			return fmt.Errorf("constructing controller %q: %w", name, err)
		}
		loops.Add(1)
		go func(name string, loop controller.Interface) {
			defer loops.Done()
			log.Info("starting controller", "controller", name)
			if err := loop.Run(5, ctx); err != nil {
				errs <- fmt.Errorf("controller %q: %w", name, err)
			}
		}(name, loop)
	}
	shared, err := factory.Build()
	if err != nil {
		return err
	}
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	loops.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// runCAInjector does what cmd/cainjector/app does: a controller-runtime manager with the injectable kinds in its
// scheme, and the release's reconcilers for webhook configurations, API services and CRD conversion.
func runCAInjector(ctx context.Context, kubeconfig string) error {
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	restConfig = util.RestConfigWithUserAgent(restConfig, "cainjector")
	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	utilruntime.Must(apiregistrationv1.AddToScheme(scheme))
	manager, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Client: client.Options{Cache: &client.CacheOptions{
			// The injector reads Secrets and Certificates through its metadata watches and direct reads.
			DisableFor: []client.Object{&corev1.Secret{}},
		}},
		Cache: cache.Options{},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	err = cainjector.RegisterAllInjectors(ctx, manager, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			"mutatingwebhookconfiguration":   true,
			"validatingwebhookconfiguration": true,
			"apiservice":                     true,
			"customresourcedefinition":       true,
		},
	})
	if err != nil {
		return fmt.Errorf("registering the injectors: %w", err)
	}
	return manager.Start(ctx)
}

// runWebhook does what cmd/webhook/app does, serving the certificate files it is given (the release's
// tlsConfig.filesystem mode), so that the API server can reach it on 127.0.0.1.
func runWebhook(ctx context.Context, log logr.Logger, config webhookconfig.WebhookConfiguration, cert, key string) error {
	config.TLSConfig.Filesystem.CertFile = cert
	config.TLSConfig.Filesystem.KeyFile = key
	server, err := cmwebhook.NewCertManagerWebhookServer(log, config)
	if err != nil {
		return fmt.Errorf("building the webhook server: %w", err)
	}
	return server.Run(ctx)
}

package main

// The API server's admission webhook plugins, built and initialised as kube-apiserver v1.34.4 does
// (k8s.io/kubernetes pkg/controlplane/apiserver/admission/config.go and config.go CreateProxyTransport), with a
// fake clientset in place of the API server's own informers.

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"

	"go.opentelemetry.io/otel/trace/noop"
	admv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/admission"
	genericinit "k8s.io/apiserver/pkg/admission/initializer"
	webhookinit "k8s.io/apiserver/pkg/admission/plugin/webhook/initializer"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/validating"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	webhookutil "k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// Mode is how the webhook configurations reach the webhook: "service" as installed (clientConfig.service, which the
// API server dials with ALPN http/1.1 only and one transport per path), or "url" as the real-cluster tier rewrites
// them (https://127.0.0.1:port/path, a loopback URL, for which the client also offers h2 and /mutate and /validate
// share one transport: webhookutil.ClientManager.hookClientConfig and client-go's tlsCache).
type Mode string

const (
	ModeService Mode = "service"
	ModeURL     Mode = "url"
)

// Admission is what one creation goes through: the mutating plugin, then the validating one.
type Admission struct {
	Mutating   *mutating.Plugin
	Validating *validating.Plugin
	Objects    admission.ObjectInterfaces
	stop       chan struct{}
}

func (a *Admission) Close() { close(a.stop) }

// staticResolver sends every Service to the local webhook (kube-apiserver resolves the Service's cluster IP).
type staticResolver struct{ host string }

func (r staticResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	return &url.URL{Scheme: "https", Host: r.host}, nil
}

// LoadConfigurations reads the MutatingWebhookConfiguration and ValidatingWebhookConfiguration of a manifest and
// points every entry at addr with caBundle, in the given mode.
func LoadConfigurations(path, addr string, caBundle []byte, mode Mode) (*admv1.MutatingWebhookConfiguration,
	*admv1.ValidatingWebhookConfiguration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var mwc *admv1.MutatingWebhookConfiguration
	var vwc *admv1.ValidatingWebhookConfiguration
	decoder := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var raw json.RawMessage
		if err := decoder.Decode(&raw); err == io.EOF {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		var meta metav1.TypeMeta
		if err := json.Unmarshal(raw, &meta); err != nil {
			return nil, nil, err
		}
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			mwc = &admv1.MutatingWebhookConfiguration{}
			if err := json.Unmarshal(raw, mwc); err != nil {
				return nil, nil, err
			}
			for i := range mwc.Webhooks {
				h := &mwc.Webhooks[i]
				defaults(&h.FailurePolicy, &h.MatchPolicy, &h.NamespaceSelector, &h.ObjectSelector, &h.TimeoutSeconds, h.Rules)
				if h.ReinvocationPolicy == nil {
					h.ReinvocationPolicy = ptr.To(admv1.NeverReinvocationPolicy)
				}
				point(&h.ClientConfig, addr, caBundle, mode)
			}
		case "ValidatingWebhookConfiguration":
			vwc = &admv1.ValidatingWebhookConfiguration{}
			if err := json.Unmarshal(raw, vwc); err != nil {
				return nil, nil, err
			}
			for i := range vwc.Webhooks {
				h := &vwc.Webhooks[i]
				defaults(&h.FailurePolicy, &h.MatchPolicy, &h.NamespaceSelector, &h.ObjectSelector, &h.TimeoutSeconds, h.Rules)
				point(&h.ClientConfig, addr, caBundle, mode)
			}
		}
	}
	if mwc == nil || vwc == nil {
		return nil, nil, fmt.Errorf("%s holds no MutatingWebhookConfiguration or no ValidatingWebhookConfiguration", path)
	}
	return mwc, vwc, nil
}

// defaults are what the API server stores for fields a configuration leaves out (k8s.io/kubernetes
// pkg/apis/admissionregistration/v1/defaults.go); the fake clientset applies none, and a nil selector matches nothing.
func defaults(failure **admv1.FailurePolicyType, match **admv1.MatchPolicyType, namespaces, objects **metav1.LabelSelector,
	timeout **int32, rules []admv1.RuleWithOperations) {
	if *failure == nil {
		*failure = ptr.To(admv1.Fail)
	}
	if *match == nil {
		*match = ptr.To(admv1.Equivalent)
	}
	if *namespaces == nil {
		*namespaces = &metav1.LabelSelector{}
	}
	if *objects == nil {
		*objects = &metav1.LabelSelector{}
	}
	if *timeout == nil {
		*timeout = ptr.To[int32](10)
	}
	for i := range rules {
		if rules[i].Scope == nil {
			rules[i].Scope = ptr.To(admv1.AllScopes)
		}
	}
}

func point(cc *admv1.WebhookClientConfig, addr string, caBundle []byte, mode Mode) {
	cc.CABundle = caBundle
	if cc.Service != nil && cc.Service.Port == nil {
		cc.Service.Port = ptr.To[int32](443)
	}
	if mode == ModeURL && cc.Service != nil {
		path := "/"
		if cc.Service.Path != nil {
			path = *cc.Service.Path
		}
		u := "https://" + addr + path
		cc.URL, cc.Service = &u, nil
	}
}

// NewAdmission builds both plugins over the configurations, as kube-apiserver initialises them.
func NewAdmission(mwc *admv1.MutatingWebhookConfiguration, vwc *admv1.ValidatingWebhookConfiguration,
	namespace *corev1.Namespace, addr string) (*Admission, error) {
	client := fake.NewClientset(namespace, mwc, vwc)
	factory := informers.NewSharedInformerFactory(client, 0)
	stop := make(chan struct{})
	// kube-apiserver's proxy transport (CreateProxyTransport): its DialContext becomes every Service webhook's dialer.
	proxy := utilnet.SetTransportDefaults(&http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}})
	// No egress selector and no tracing configuration: kube-apiserver's defaults.
	wrapper := webhookutil.NewDefaultAuthenticationInfoResolverWrapper(proxy, nil, nil, noop.NewTracerProvider())
	initializers := admission.PluginInitializers{
		genericinit.New(client, nil, factory, nil, utilfeature.DefaultFeatureGate, stop, nil),
		webhookinit.NewPluginInitializer(wrapper, staticResolver{addr}),
	}
	m, err := mutating.NewMutatingWebhook(nil)
	if err != nil {
		return nil, err
	}
	v, err := validating.NewValidatingAdmissionWebhook(nil)
	if err != nil {
		return nil, err
	}
	initializers.Initialize(m)
	initializers.Initialize(v)
	if err := admission.ValidateInitialization(m); err != nil {
		return nil, err
	}
	if err := admission.ValidateInitialization(v); err != nil {
		return nil, err
	}
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	if !m.WaitForReady() || !v.WaitForReady() {
		return nil, fmt.Errorf("the admission plugins did not become ready")
	}
	return &Admission{Mutating: m, Validating: v, Objects: admission.NewObjectInterfacesFromScheme(podScheme()), stop: stop}, nil
}

// podScheme knows v1 Pods. The API server hands admission its internal Pod and converts it to v1 for the webhook
// and back after a patch; here the object is a v1 Pod already, so the conversion back is a copy.
func podScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := scheme.AddConversionFunc((*corev1.Pod)(nil), (*corev1.Pod)(nil), func(a, b any, _ conversion.Scope) error {
		a.(*corev1.Pod).DeepCopyInto(b.(*corev1.Pod))
		return nil
	}); err != nil {
		panic(err)
	}
	return scheme
}

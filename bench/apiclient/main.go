// Command apiclient is a double of kube-apiserver's admission webhook client for the gpushare webhook's benchmarks.
//
// It runs the API server's own mutating and validating admission plugins (k8s.io/apiserver v0.34.4, initialised as
// kube-apiserver v1.34.4 initialises them: the same ClientManager, rest client, transport, TLS configuration with the
// caBundle, timeouts and connection pool) over the webhook configurations of manifests/base/admission.yaml pointed at
// a local webhook, and creates pods in the shapes the API server sees them: one after another; a ReplicaSet's
// slow-start batches, through kube-controller-manager's client rate limit (burst) or without one (flood); or a pause
// that lets the connections idle. Shapes run in order in one process, so connections carry over from one to the
// next as they do in one API server.
//
// For each shape it prints one JSON line: per webhook entry, the API server's own admission metric
// (apiserver_admission_webhook_admission_duration_seconds, mean), the latency of each call as its client saw it
// (mean, p50, p99), the connections dialled and TLS handshakes made; and what the webhook counted meanwhile, read
// from its metrics port.
//
//	apiclient -addr 127.0.0.1:8443 -ca ca.crt -admission manifests/base/admission.yaml -pod pod.json \
//	    -metrics http://127.0.0.1:9102/metrics -mode service -shapes sequential:30:100ms,burst:30,burst:300
//
// `apiclient floor` serves the benchmark's baseline instead (floor.go). bench/bench_apiserver_client.py runs both.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Shape is one load: Kind "sequential" (Count creations, Gap apart), "burst" (a ReplicaSet of Count pods created by
// kube-controller-manager, through its client's rate limit), "flood" (the same batches with no rate limit: many
// writers at once) or "pause" (no creation for Gap: the connections idle, as between two bursts on a cluster).
type Shape struct {
	Name  string
	Kind  string
	Count int
	Gap   time.Duration
}

const shapeSyntax = "want sequential:COUNT[:GAP], burst:COUNT, flood:COUNT or pause:DURATION"

func parseShapes(text string) ([]Shape, error) {
	var out []Shape
	for _, item := range strings.Split(text, ",") {
		parts := strings.Split(strings.TrimSpace(item), ":")
		shape := Shape{Name: strings.TrimSpace(item), Kind: parts[0]}
		var err error
		switch {
		case parts[0] == "pause" && len(parts) == 2:
			if shape.Gap, err = time.ParseDuration(parts[1]); err != nil {
				return nil, fmt.Errorf("shape %q: %w", item, err)
			}
			out = append(out, shape)
			continue
		case parts[0] == "sequential" && (len(parts) == 2 || len(parts) == 3):
		case (parts[0] == "burst" || parts[0] == "flood") && len(parts) == 2:
		default:
			return nil, fmt.Errorf("shape %q: %s", item, shapeSyntax)
		}
		if shape.Count, err = strconv.Atoi(parts[1]); err != nil || shape.Count < 1 {
			return nil, fmt.Errorf("shape %q: the count is not a positive number", item)
		}
		if len(parts) == 3 {
			if shape.Gap, err = time.ParseDuration(parts[2]); err != nil {
				return nil, fmt.Errorf("shape %q: %w", item, err)
			}
		}
		out = append(out, shape)
	}
	return out, nil
}

// HookFigures are one webhook entry's calls in one shape.
type HookFigures struct {
	Calls           int            `json:"calls"`
	APIServerMeanMs float64        `json:"apiserver_mean_ms"` // apiserver_admission_webhook_admission_duration_seconds
	MeanMs          float64        `json:"mean_ms"`
	P50Ms           float64        `json:"p50_ms"`
	P99Ms           float64        `json:"p99_ms"`
	MaxMs           float64        `json:"max_ms"`
	NewConnections  int            `json:"new_connections"`
	Handshakes      int            `json:"handshakes"`
	HandshakeMeanMs float64        `json:"handshake_mean_ms"`
	Resumed         int            `json:"resumed"`
	Protocols       map[string]int `json:"protocols"` // ALPN result of each handshake ("http/1.1", "h2", "" for none)
}

// Report is one shape's line.
type Report struct {
	Shape     string                  `json:"shape"`
	Mode      Mode                    `json:"mode"`
	Creations int                     `json:"creations"`
	Errors    []string                `json:"errors"`
	Seconds   float64                 `json:"seconds"`
	Hooks     map[string]*HookFigures `json:"hooks"`
	Webhook   map[string]float64      `json:"webhook"` // the webhook's counters over the shape (see webhookCounters)
}

func figures(calls []Call) *HookFigures {
	f := &HookFigures{Calls: len(calls), Protocols: map[string]int{}}
	if len(calls) == 0 {
		return f
	}
	ms := make([]float64, len(calls))
	var sum, shake float64
	for i, c := range calls {
		ms[i] = c.Seconds * 1000
		sum += ms[i]
		if c.NewConn {
			f.NewConnections++
		}
		if c.Handshake > 0 {
			f.Handshakes++
			shake += c.Handshake * 1000
			f.Protocols[c.Proto]++
			if c.Resumed {
				f.Resumed++
			}
		}
	}
	sort.Float64s(ms)
	f.MeanMs = sum / float64(len(ms))
	f.P50Ms = ms[len(ms)/2]
	f.P99Ms = ms[min(len(ms)-1, int(float64(len(ms))*0.99))]
	f.MaxMs = ms[len(ms)-1]
	if f.Handshakes > 0 {
		f.HandshakeMeanMs = shake / float64(f.Handshakes)
	}
	return f
}

// admissionDurations sums apiserver_admission_webhook_admission_duration_seconds by webhook name: (sum, count).
func admissionDurations() map[string][2]float64 {
	out := map[string][2]float64{}
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return out
	}
	for _, family := range families {
		if family.GetName() != "apiserver_admission_webhook_admission_duration_seconds" {
			continue
		}
		for _, m := range family.GetMetric() {
			for _, label := range m.GetLabel() {
				if label.GetName() == "name" {
					was := out[label.GetValue()]
					h := m.GetHistogram()
					out[label.GetValue()] = [2]float64{was[0] + h.GetSampleSum(), was[1] + float64(h.GetSampleCount())}
				}
			}
		}
	}
	return out
}

func run(admission *Admission, template *corev1.Pod, shape Shape, mode Mode, metricsURL string) Report {
	create := func() Creation { return admission.Create(template) }
	before, apiBefore := scrape(metricsURL), admissionDurations()
	start := time.Now()
	var creations []Creation
	switch shape.Kind {
	case "sequential":
		creations = Sequential(shape.Count, shape.Gap, create)
	case "burst":
		creations = SlowStart(shape.Count, ControllerManagerLimit(), create)
	default:
		creations = SlowStart(shape.Count, nil, create)
	}
	report := Report{Shape: shape.Name, Mode: mode, Creations: len(creations), Errors: []string{},
		Seconds: time.Since(start).Seconds(), Hooks: map[string]*HookFigures{}}
	var mutates, validates []Call
	for _, c := range creations {
		if c.Err != nil {
			if len(report.Errors) < 5 {
				report.Errors = append(report.Errors, c.Err.Error())
			}
			continue
		}
		mutates, validates = append(mutates, c.Mutate), append(validates, c.Validate)
	}
	report.Hooks["mutate.gpushare.io"] = figures(mutates)
	report.Hooks["validate.gpushare.io"] = figures(validates)
	for name, now := range admissionDurations() {
		if f, ok := report.Hooks[name]; ok && now[1] > apiBefore[name][1] {
			f.APIServerMeanMs = 1000 * (now[0] - apiBefore[name][0]) / (now[1] - apiBefore[name][1])
		}
	}
	report.Webhook = webhookCounters(before, scrape(metricsURL))
	return report
}

func loadPod(path string) (*corev1.Pod, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(data, pod); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	pod.APIVersion, pod.Kind = "v1", "Pod"
	return pod, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "floor" {
		if err := floorMain(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "apiclient floor: %v\n", err)
			os.Exit(1)
		}
		return
	}
	addr := flag.String("addr", "", "the webhook's host:port")
	caFile := flag.String("ca", "", "the CA bundle that signs the webhook's serving certificate (caBundle)")
	admissionFile := flag.String("admission", "", "a manifest with the MutatingWebhookConfiguration and ValidatingWebhookConfiguration")
	podFile := flag.String("pod", "", "the pod to create, as JSON")
	metricsURL := flag.String("metrics", "", "the webhook's /metrics URL (empty: no webhook counters)")
	mode := flag.String("mode", string(ModeService), "service (as installed) or url (https://ADDR/path, as the real-cluster tier)")
	shapesText := flag.String("shapes", "sequential:30:100ms,burst:30,burst:300", "comma-separated shapes, run in order")
	pause := flag.Duration("pause", 2*time.Second, "between two shapes (a burst's rate limit refills in 1.5 s)")
	flag.Parse()
	if err := main1(*addr, *caFile, *admissionFile, *podFile, *metricsURL, Mode(*mode), *shapesText, *pause); err != nil {
		fmt.Fprintf(os.Stderr, "apiclient: %v\n", err)
		os.Exit(1)
	}
}

func main1(addr, caFile, admissionFile, podFile, metricsURL string, mode Mode, shapesText string, pause time.Duration) error {
	if addr == "" || caFile == "" || admissionFile == "" || podFile == "" {
		return fmt.Errorf("-addr, -ca, -admission and -pod are required")
	}
	if mode != ModeService && mode != ModeURL {
		return fmt.Errorf("-mode is service or url, not %q", mode)
	}
	shapes, err := parseShapes(shapesText)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	template, err := loadPod(podFile)
	if err != nil {
		return err
	}
	mwc, vwc, err := LoadConfigurations(admissionFile, addr, ca, mode)
	if err != nil {
		return err
	}
	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: template.Namespace,
		Labels: map[string]string{"kubernetes.io/metadata.name": template.Namespace}}}
	admission, err := NewAdmission(mwc, vwc, namespace, addr)
	if err != nil {
		return err
	}
	defer admission.Close()
	out := json.NewEncoder(os.Stdout)
	for i, shape := range shapes {
		if shape.Kind == "pause" {
			time.Sleep(shape.Gap)
			continue
		}
		if i > 0 && shapes[i-1].Kind != "pause" {
			time.Sleep(pause)
		}
		if err := out.Encode(run(admission, template, shape, mode, metricsURL)); err != nil {
			return err
		}
	}
	return nil
}

package main

// One pod creation as the API server admits it, timed call by call, and the load shapes that issue them.

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	endpointsrequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/util/flowcontrol"
)

// Call is one webhook call as the client saw it.
type Call struct {
	Seconds   float64 // the HTTP call and its answer's decoding (the API server's webhook latency tracker)
	NewConn   bool    // a connection was dialled for it (not taken from the idle pool)
	Handshake float64 // seconds of its TLS handshake, when it made one
	Resumed   bool    // that handshake resumed a TLS session
	Proto     string  // the ALPN protocol negotiated on its connection ("" when none: HTTP/1.1)
}

// probe records what net/http did for one call (httptrace), as the API server's own client makes it.
type probe struct {
	mu        sync.Mutex
	reused    bool
	got       bool
	tlsStart  time.Time
	handshake time.Duration
	resumed   bool
	proto     string
}

func (p *probe) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			p.mu.Lock()
			p.got, p.reused = true, info.Reused
			p.mu.Unlock()
		},
		TLSHandshakeStart: func() {
			p.mu.Lock()
			p.tlsStart = time.Now()
			p.mu.Unlock()
		},
		TLSHandshakeDone: func(state tls.ConnectionState, err error) {
			p.mu.Lock()
			p.handshake = time.Since(p.tlsStart)
			p.resumed = state.DidResume
			p.proto = state.NegotiatedProtocol
			p.mu.Unlock()
		},
	}
}

// A dial started for a call may end up serving another one (net/http gives a waiting request whichever connection
// frees first); the handshake is counted on the call whose trace saw it, and a call counts as new when the
// connection it got was not reused.
func (p *probe) call(seconds time.Duration) Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Call{Seconds: seconds.Seconds(), NewConn: p.got && !p.reused, Handshake: p.handshake.Seconds(),
		Resumed: p.resumed, Proto: p.proto}
}

// Creation is one pod's two webhook calls.
type Creation struct {
	Mutate, Validate Call
	Err              error
}

var creator = &user.DefaultInfo{
	Name:   "system:serviceaccount:kube-system:replicaset-controller",
	UID:    "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
	Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
}

var createOptions = &metav1.CreateOptions{TypeMeta: metav1.TypeMeta{Kind: "CreateOptions", APIVersion: "meta.k8s.io/v1"}}

var serial atomic.Int64

func attributes(pod *corev1.Pod) admission.Attributes {
	return admission.NewAttributesRecord(pod, nil, corev1.SchemeGroupVersion.WithKind("Pod"), pod.Namespace, pod.Name,
		corev1.SchemeGroupVersion.WithResource("pods"), "", admission.Create, createOptions, false, creator)
}

// Create admits one copy of template as a ReplicaSet's pod creation does: mutating admission, then (the name
// generated in between, by the registry's BeforeCreate) validating admission.
func (a *Admission) Create(template *corev1.Pod) Creation {
	pod := template.DeepCopy()
	var out Creation
	mutate, validate := &probe{}, &probe{}
	ctx := endpointsrequest.WithLatencyTrackers(context.Background())
	if err := a.Mutating.Admit(httptrace.WithClientTrace(ctx, mutate.trace()), attributes(pod), a.Objects); err != nil {
		out.Err = fmt.Errorf("mutating admission: %w", err)
		return out
	}
	trackers, _ := endpointsrequest.LatencyTrackersFrom(ctx)
	out.Mutate = mutate.call(trackers.MutatingWebhookTracker.GetLatency())
	pod.Name = fmt.Sprintf("%s%05d", pod.GenerateName, serial.Add(1))
	if err := a.Validating.Validate(httptrace.WithClientTrace(ctx, validate.trace()), attributes(pod), a.Objects); err != nil {
		out.Err = fmt.Errorf("validating admission: %w", err)
		return out
	}
	out.Validate = validate.call(trackers.ValidatingWebhookTracker.GetLatency())
	return out
}

// Sequential creates count pods one after another, gap apart (a person or a script running kubectl create).
func Sequential(count int, gap time.Duration, create func() Creation) []Creation {
	out := make([]Creation, 0, count)
	for i := 0; i < count; i++ {
		if i > 0 && gap > 0 {
			time.Sleep(gap)
		}
		out = append(out, create())
	}
	return out
}

// The rate limit of kube-controller-manager's clients, which create a ReplicaSet's pods: --kube-api-qps 20 and
// --kube-api-burst 30 by default (k8s.io/kubernetes pkg/controller/apis/config/v1alpha1/defaults.go). Past the first
// 30 creations of a burst, pods reach the API server, and so the webhook, at most 20 a second.
const (
	controllerManagerQPS   = 20
	controllerManagerBurst = 30
)

// ControllerManagerLimit is a fresh token bucket with kube-controller-manager's default client limits.
func ControllerManagerLimit() flowcontrol.RateLimiter {
	return flowcontrol.NewTokenBucketRateLimiter(controllerManagerQPS, controllerManagerBurst)
}

// SlowStart creates count pods as the ReplicaSet controller does (k8s.io/kubernetes pkg/controller/replicaset,
// slowStartBatch with SlowStartInitialBatchSize 1): batches of 1, 2, 4, 8, ... concurrent creations, each batch
// started once the previous one has finished; each creation first waits for limit (nil: none), as every request of
// the controller's client does (client-go rest.Request.tryThrottle).
func SlowStart(count int, limit flowcontrol.RateLimiter, create func() Creation) []Creation {
	out := make([]Creation, 0, count)
	var mu sync.Mutex
	remaining := count
	for batch := min(remaining, 1); batch > 0; batch = min(2*batch, remaining) {
		var wg sync.WaitGroup
		wg.Add(batch)
		for i := 0; i < batch; i++ {
			go func() {
				defer wg.Done()
				if limit != nil {
					limit.Accept()
				}
				c := create()
				mu.Lock()
				out = append(out, c)
				mu.Unlock()
			}()
		}
		wg.Wait()
		remaining -= batch
	}
	return out
}

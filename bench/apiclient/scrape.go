package main

// The webhook's own counters, read from its Prometheus text endpoint before and after a shape.

import (
	"bufio"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Sample is one line of the text exposition: a metric name, its labels and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

var labelPattern = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

func scrape(url string) []Sample {
	if url == "" {
		return nil
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out []Sample
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() {
		line := lines.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		cut := strings.LastIndexByte(line, ' ')
		if cut < 0 {
			continue
		}
		value, err := strconv.ParseFloat(line[cut+1:], 64)
		if err != nil {
			continue
		}
		series := line[:cut]
		sample := Sample{Name: series, Labels: map[string]string{}, Value: value}
		if brace := strings.IndexByte(series, '{'); brace >= 0 {
			sample.Name = series[:brace]
			for _, m := range labelPattern.FindAllStringSubmatch(series[brace:], -1) {
				sample.Labels[m[1]] = m[2]
			}
		}
		out = append(out, sample)
	}
	return out
}

func total(samples []Sample, name string, labels map[string]string) float64 {
	var sum float64
next:
	for _, s := range samples {
		if s.Name != name {
			continue
		}
		for k, v := range labels {
			if s.Labels[k] != v {
				continue next
			}
		}
		sum += s.Value
	}
	return sum
}

// webhookCounters are the differences over a shape of what the webhook counts on the wire (webhook/server/metrics.py).
func webhookCounters(before, after []Sample) map[string]float64 {
	out := map[string]float64{}
	if after == nil {
		return out
	}
	delta := func(name string, labels map[string]string) float64 {
		return total(after, name, labels) - total(before, name, labels)
	}
	out["connections_accepted"] = delta("gpushare_webhook_connections_accepted_total", nil)
	out["handshakes_completed"] = delta("gpushare_webhook_tls_handshakes_total", map[string]string{"outcome": "completed"})
	out["handshakes_failed"] = delta("gpushare_webhook_tls_handshakes_total", map[string]string{"outcome": "failed"})
	out["sessions_resumed"] = delta("gpushare_webhook_tls_sessions_resumed_total", nil)
	shakes := delta("gpushare_webhook_tls_handshake_duration_seconds_count", nil)
	if shakes > 0 {
		out["handshake_mean_ms"] = 1000 * delta("gpushare_webhook_tls_handshake_duration_seconds_sum", nil) / shakes
	}
	for _, endpoint := range []string{"mutate", "validate"} {
		labels := map[string]string{"endpoint": endpoint}
		n := delta("gpushare_webhook_request_duration_seconds_count", labels)
		out[endpoint+"_requests"] = n
		if n > 0 {
			out[endpoint+"_request_mean_ms"] = 1000 * delta("gpushare_webhook_request_duration_seconds_sum", labels) / n
			out[endpoint+"_review_mean_ms"] = 1000 * delta("gpushare_webhook_review_duration_seconds_sum", labels) /
				delta("gpushare_webhook_review_duration_seconds_count", labels)
		}
	}
	return out
}

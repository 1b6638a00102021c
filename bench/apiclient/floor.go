package main

// The floor: a webhook that costs next to nothing, for the benchmark's baseline. Go's net/http over TLS with the same
// serving certificate as the webhook; /mutate answers every review with the same JSONPatch the webhook gives the
// benchmark's pod (read from a file), so the API server applies the same patch, and /validate allows. What the API
// server records against it is what its own client, its encoding and the patch cost, with a server that adds almost
// nothing.
//
//	apiclient floor -listen 127.0.0.1:8444 -cert tls.crt -key tls.key -patch patch.json [-h2]

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

type review struct {
	Request struct {
		UID string `json:"uid"`
	} `json:"request"`
}

func answer(w http.ResponseWriter, r *http.Request, patch []byte) {
	body, err := io.ReadAll(r.Body)
	var in review
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	response := map[string]any{"uid": in.Request.UID, "allowed": true}
	if patch != nil {
		response["patchType"] = "JSONPatch"
		response["patch"] = patch // []byte: base64 in JSON, as the AdmissionReview wants it
	}
	out, _ := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"response": response})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

func floorMain(args []string) error {
	flags := flag.NewFlagSet("floor", flag.ExitOnError)
	listen := flags.String("listen", "127.0.0.1:0", "host:port to serve on")
	certFile := flags.String("cert", "", "the serving certificate (PEM)")
	keyFile := flags.String("key", "", "its key (PEM)")
	patchFile := flags.String("patch", "", "the JSONPatch /mutate answers with (JSON)")
	h2 := flags.Bool("h2", false, "offer HTTP/2 by ALPN (the webhook offers none, so HTTP/1.1 is spoken by default)")
	_ = flags.Parse(args)
	if *certFile == "" || *keyFile == "" || *patchFile == "" {
		return fmt.Errorf("-cert, -key and -patch are required")
	}
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		return err
	}
	patch, err := os.ReadFile(*patchFile)
	if err != nil {
		return err
	}
	if !json.Valid(patch) {
		return fmt.Errorf("%s is not JSON", *patchFile)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /mutate", func(w http.ResponseWriter, r *http.Request) { answer(w, r, patch) })
	mux.HandleFunc("POST /validate", func(w http.ResponseWriter, r *http.Request) { answer(w, r, nil) })
	server := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	if !*h2 {
		server.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	// The address on stdout, once listening: the benchmark reads it.
	fmt.Println(listener.Addr().String())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		_ = server.Close()
	}()
	if err := server.ServeTLS(listener, "", ""); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// Open-loop HTTP load for the soak bench: a fixed request rate for a fixed
// time, whatever the latency, so a slow gateway shows up as latency and errors
// instead of a lower offered rate (a closed loop would hide it). Also a null
// engine (-serve) answering like an OpenAI server with no model behind it.
// Standard library only: built by bench/soak.ts with `go build`.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

func serve(addr string) {
	body := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}`)
	models := []byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "application/json")
		if r.Method == http.MethodGet {
			w.Write(models)
			return
		}
		w.Write(body)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("listening", ln.Addr().String())
	http.Serve(ln, h)
}

type result struct {
	Sent       int64            `json:"sent"`
	OK         int64            `json:"ok"`
	Errors     map[string]int64 `json:"errors"`
	Skipped    int64            `json:"skipped"`
	Seconds    float64          `json:"seconds"`
	Rate       float64          `json:"achieved_rps"`
	P50ms      float64          `json:"p50_ms"`
	P99ms      float64          `json:"p99_ms"`
	P999ms     float64          `json:"p999_ms"`
	MaxMs      float64          `json:"max_ms"`
	PerSecond  []int64          `json:"ok_per_second"`
}

func main() {
	serveAddr := flag.String("serve", "", "run a null engine on this address instead")
	url := flag.String("url", "", "target URL (POST, chat completions body)")
	rate := flag.Int("rate", 1000, "requests per second")
	secs := flag.Int("seconds", 300, "duration")
	maxInflight := flag.Int("max-inflight", 2048, "requests in flight before new ones are skipped (counted)")
	flag.Parse()
	if *serveAddr != "" {
		serve(*serveAddr)
		return
	}
	if *url == "" || *rate <= 0 || *secs <= 0 || *secs > 3600 {
		fmt.Fprintln(os.Stderr, "need -url, 0 < -rate, 0 < -seconds <= 3600")
		os.Exit(2)
	}
	tr := &http.Transport{MaxIdleConns: *maxInflight, MaxIdleConnsPerHost: *maxInflight, IdleConnTimeout: 90 * time.Second}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var inflight, sent, ok, skipped int64
	var mu sync.Mutex
	errs := map[string]int64{}
	lat := make([]float64, 0, *rate**secs)
	perSec := make([]int64, *secs+30)
	start := time.Now()
	var wg sync.WaitGroup
	total := int64(*rate) * int64(*secs)
	interval := time.Second / time.Duration(*rate)
	for i := int64(0); i < total; i++ {
		// Open loop: request i leaves at start + i*interval.
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		if atomic.LoadInt64(&inflight) >= int64(*maxInflight) {
			skipped++
			continue
		}
		atomic.AddInt64(&inflight, 1)
		sent++
		wg.Add(1)
		go func(i int64) {
			defer wg.Done()
			defer atomic.AddInt64(&inflight, -1)
			b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("soak request %d: what is %d plus %d?", i, i%97, i%89)}}})
			t0 := time.Now()
			resp, err := client.Post(*url, "application/json", bytes.NewReader(b))
			var key string
			if err != nil {
				key = "transport: " + err.Error()
			} else {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					key = fmt.Sprintf("HTTP %d", resp.StatusCode)
				}
			}
			ms := float64(time.Since(t0).Microseconds()) / 1000
			mu.Lock()
			if key != "" {
				if len(key) > 160 {
					key = key[:160]
				}
				errs[key]++
			} else {
				ok++
				lat = append(lat, ms)
				if s := int(time.Since(start).Seconds()); s < len(perSec) {
					perSec[s]++
				}
			}
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	sort.Float64s(lat)
	q := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		k := int(p * float64(len(lat)))
		if k >= len(lat) {
			k = len(lat) - 1
		}
		return lat[k]
	}
	r := result{Sent: sent, OK: ok, Errors: errs, Skipped: skipped, Seconds: el, Rate: float64(ok) / el, P50ms: q(0.5), P99ms: q(0.99), P999ms: q(0.999), MaxMs: q(1), PerSecond: perSec[:*secs]}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

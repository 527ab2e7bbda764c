package gateway_test

import "net/http"

type headerRT struct {
	h    map[string]string
	next http.RoundTripper
}

func (r headerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range r.h {
		req.Header.Set(k, v)
	}
	return r.next.RoundTrip(req)
}

func httpClientWith(h map[string]string) *http.Client {
	return &http.Client{Transport: headerRT{h: h, next: http.DefaultTransport}}
}

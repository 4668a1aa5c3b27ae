package triagehttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/outcome"
)

// NewLoadTarget returns a loadtest.Target that sends method requests to
// rawURL with body (may be nil) and header, through client, reading and
// discarding up to 1 MiB of each response. Give client a Transport
// without a Policy, with the URL's host in Internal, to send each call's
// criticality the way triage's clients do; nil means http.DefaultClient.
//
// Redirects are not followed, whatever client's CheckRedirect says: a
// target on this machine could send the load to another host past every
// check of where it goes. Outcomes: OK for a 2xx status; Redirected for
// a 3xx; Overloaded for 429 and 503 (and the *outcome.Error a Transport
// returns for them); DeadlineExceeded when the call's deadline passed (or
// 504); Failed for any other status or error.
func NewLoadTarget(client *http.Client, method, rawURL string, body []byte, header http.Header) (loadtest.Target, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("triagehttp: load target: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("triagehttp: load target %q is not an http or https URL", rawURL)
	}
	if method == "" {
		method = http.MethodGet
	}
	if _, err := http.NewRequest(method, rawURL, nil); err != nil {
		return nil, fmt.Errorf("triagehttp: load target: %w", err)
	}
	if client == nil {
		client = http.DefaultClient
	}
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &loadTarget{client: &c, method: method, url: u.String(), body: body, header: header.Clone()}, nil
}

type loadTarget struct {
	client *http.Client
	method string
	url    string
	body   []byte
	header http.Header
}

func (t *loadTarget) Call(ctx context.Context) loadtest.Outcome {
	var body io.Reader
	if t.body != nil {
		body = bytes.NewReader(t.body)
	}
	req, err := http.NewRequestWithContext(ctx, t.method, t.url, body)
	if err != nil {
		return loadtest.Failed
	}
	for k, v := range t.header {
		req.Header[k] = v
	}
	resp, err := t.client.Do(req)
	if err != nil {
		var oe *outcome.Error
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
			return loadtest.DeadlineExceeded
		case errors.As(err, &oe):
			// A Transport's overload outcome: the server's refusal it
			// read, or its Caller's giving up.
			return loadtest.Overloaded
		}
		return loadtest.Failed
	}
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	switch {
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return loadtest.DeadlineExceeded
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		return loadtest.Overloaded
	case resp.StatusCode == http.StatusGatewayTimeout:
		return loadtest.DeadlineExceeded
	case err != nil, resp.StatusCode >= 400:
		return loadtest.Failed
	case resp.StatusCode >= 300:
		return loadtest.Redirected
	}
	return loadtest.OK
}

package outcome_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/triagehq/triage/outcome"
)

func TestClassifyAndIs(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want outcome.Kind
		is   error
	}{
		{"nil", nil, outcome.Success, nil},
		{"plain", errors.New("boom"), outcome.Failure, nil},
		{"overloaded", outcome.New(outcome.TaskOverloaded, "cpu"), outcome.TaskOverloaded, outcome.ErrTaskOverloaded},
		{"dont-retry", outcome.New(outcome.DontRetry, ""), outcome.DontRetry, outcome.ErrDontRetry},
		{"quota", &outcome.Error{Kind: outcome.OutOfQuota, RetryAfter: time.Second}, outcome.OutOfQuota, outcome.ErrOutOfQuota},
		{"wrapped", fmt.Errorf("calling B: %w", outcome.New(outcome.DontRetry, "")), outcome.DontRetry, outcome.ErrDontRetry},
		{"sentinel alone is not an outcome", outcome.ErrTaskOverloaded, outcome.Failure, outcome.ErrTaskOverloaded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := outcome.Classify(tt.err); got != tt.want {
				t.Fatalf("Classify = %v, want %v", got, tt.want)
			}
			for _, s := range []error{outcome.ErrTaskOverloaded, outcome.ErrDontRetry, outcome.ErrOutOfQuota} {
				if got, want := errors.Is(tt.err, s), s == tt.is && tt.is != nil; got != want {
					t.Errorf("errors.Is(err, %v) = %v, want %v", s, got, want)
				}
			}
		})
	}
}

func TestNewRefusesNonOverloadKinds(t *testing.T) {
	if k := outcome.New(outcome.Success, "").Kind; k != outcome.TaskOverloaded {
		t.Fatalf("New(Success) kind = %v", k)
	}
}

func TestKinds(t *testing.T) {
	for k := outcome.Kind(0); k < outcome.NumKinds; k++ {
		back, ok := outcome.ParseToken(k.Token())
		if k.Overload() != ok || (ok && back != k) {
			t.Errorf("ParseToken(%q) = %v, %v", k.Token(), back, ok)
		}
		if k.Retriable() != (k == outcome.TaskOverloaded) {
			t.Errorf("%v.Retriable() = %v", k, k.Retriable())
		}
	}
	if _, ok := outcome.ParseToken("TASK-OVERLOADED"); ok {
		t.Error("ParseToken accepted a non-canonical token")
	}
}

func TestErrorText(t *testing.T) {
	e := &outcome.Error{Kind: outcome.OutOfQuota, RetryAfter: 2 * time.Second, Reason: "acme", Local: true}
	if got, want := e.Error(), "triage: customer out of quota (rejected locally) (acme); retry after 2s"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for in, want := range map[string]time.Duration{"0": 0, "1": time.Second, "120": 2 * time.Minute, "999999": outcome.MaxRetryAfter} {
		if got, ok := outcome.ParseRetryAfterSeconds(in); !ok || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "-1", "1.5", "1000000", "Wed, 21 Oct 2015 07:28:00 GMT", " 1"} {
		if _, ok := outcome.ParseRetryAfterSeconds(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	for d, want := range map[time.Duration]string{0: "0", -time.Second: "0", time.Millisecond: "1", 1500 * time.Millisecond: "2", 48 * time.Hour: "86400"} {
		if got := outcome.FormatRetryAfterSeconds(d); got != want {
			t.Errorf("Format(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestUpward(t *testing.T) {
	plain := errors.New("boom")
	mine := outcome.New(outcome.TaskOverloaded, "cpu")
	tests := []struct {
		name      string
		in        error
		want      outcome.Kind
		same      bool
		retryWant time.Duration
	}{
		{"nil", nil, outcome.Success, true, 0},
		{"plain", plain, outcome.Failure, true, 0},
		{"created here stays retriable", mine, outcome.TaskOverloaded, true, 0},
		{"downstream overloaded becomes dont-retry", &outcome.Error{Kind: outcome.TaskOverloaded, Downstream: true, RetryAfter: time.Second}, outcome.DontRetry, false, time.Second},
		{"wrapped downstream", fmt.Errorf("B: %w", &outcome.Error{Kind: outcome.TaskOverloaded, Downstream: true}), outcome.DontRetry, false, 0},
		{"downstream dont-retry stays", &outcome.Error{Kind: outcome.DontRetry, Downstream: true}, outcome.DontRetry, false, 0},
		{"local throttle becomes dont-retry", &outcome.Error{Kind: outcome.TaskOverloaded, Local: true}, outcome.DontRetry, false, 0},
		{"downstream quota stays quota", &outcome.Error{Kind: outcome.OutOfQuota, Downstream: true, RetryAfter: 3 * time.Second}, outcome.OutOfQuota, false, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := outcome.Upward(tt.in)
			if outcome.Classify(got) != tt.want {
				t.Fatalf("Upward kind = %v, want %v", outcome.Classify(got), tt.want)
			}
			if tt.same && got != tt.in {
				t.Fatalf("Upward changed %v to %v", tt.in, got)
			}
			if oe, ok := outcome.As(got); ok && !tt.same {
				if oe.Downstream || oe.Local {
					t.Errorf("upward error still marked downstream/local: %+v", oe)
				}
				if oe.RetryAfter != tt.retryWant {
					t.Errorf("RetryAfter = %v, want %v", oe.RetryAfter, tt.retryWant)
				}
			}
		})
	}
}

package grpcwire_test

import (
	"testing"
	"time"

	"github.com/triagehq/triage/internal/grpcwire"
)

func TestTimeout(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1S", time.Second, true}, {"250m", 250 * time.Millisecond, true}, {"99999999H", time.Duration(1<<63 - 1), true},
		{"5u", 5 * time.Microsecond, true}, {"", 0, false}, {"S", 0, false}, {"123456789S", 0, false},
		{"-1S", 0, false}, {"+1S", 0, false}, {"1s", 0, false}, {"1.5S", 0, false},
	} {
		got, ok := grpcwire.ParseTimeout(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseTimeout(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	for _, d := range []time.Duration{time.Nanosecond, 1500 * time.Millisecond, 3 * time.Hour, 1 << 62} {
		got, ok := grpcwire.ParseTimeout(grpcwire.FormatTimeout(d))
		if !ok || got < d || got > d+d/1e6+time.Microsecond && got-d > time.Hour {
			t.Errorf("FormatTimeout(%v) = %q, reads back as %v", d, grpcwire.FormatTimeout(d), got)
		}
	}
	if s := grpcwire.FormatTimeout(-time.Second); s != "0n" {
		t.Errorf("FormatTimeout of a passed deadline = %q, want 0n", s)
	}
}

func FuzzParseTimeout(f *testing.F) {
	for _, s := range []string{"1S", "250m", "99999999H", "", "1x", "-1n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := grpcwire.ParseTimeout(s)
		if ok && d < 0 {
			t.Fatalf("ParseTimeout(%q) = %v", s, d)
		}
		if ok {
			if back, ok := grpcwire.ParseTimeout(grpcwire.FormatTimeout(d)); !ok || back < d {
				t.Fatalf("%q: %v formats as %q, reads back as %v", s, d, grpcwire.FormatTimeout(d), back)
			}
		}
	})
}

func TestEncodeMessage(t *testing.T) {
	for in, want := range map[string]string{"ok": "ok", "100%": "100%25", "caf\u00e9": "caf%C3%A9", "a\nb": "a%0Ab"} {
		if got := grpcwire.EncodeMessage(in); got != want {
			t.Errorf("EncodeMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestIsGRPC(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc":               true,
		"application/grpc+proto":         true,
		"application/grpc;charset=utf-8": true,
		"Application/GRPC":               true,
		"application/grpc-web":           false,
		"application/grpc-web-text":      false,
		"application/grpc-web+proto":     false,
		"application/grpcfoo":            false,
		"application/json":               false,
		"":                               false,
		"application/grp":                false,
		" application/grpc":              false,
		"application/grpc\x00":           false,
	} {
		if got := grpcwire.IsGRPC(ct); got != want {
			t.Errorf("grpcwire.IsGRPC(%q) = %v, want %v", ct, got, want)
		}
	}
}

package attempt_test

import (
	"context"
	"errors"
	"testing"

	"github.com/triagehq/triage/attempt"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"0", 0, false}, {"1", 1, false}, {"2", 2, false}, {"3", 3, false},
		{"03", 3, false},
		{"7", attempt.MaxAttempts, false}, // clamped, not refused: it is advisory
		{"99", attempt.MaxAttempts, false},
		{"100", 0, true}, {"", 0, true}, {"-1", 0, true}, {"+1", 0, true},
		{" 1", 0, true}, {"1 ", 0, true}, {"x", 0, true}, {"١", 0, true},
		{"0x1", 0, true},
	}
	for _, tt := range tests {
		got, err := attempt.Parse(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("Parse(%q) = %d, %v; want %d, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !errors.Is(err, attempt.ErrInvalid) {
			t.Errorf("Parse(%q) error %v does not wrap ErrInvalid", tt.in, err)
		}
	}
}

func TestFormatClamps(t *testing.T) {
	for n, want := range map[int]string{-5: "0", 0: "0", 2: "2", 3: "3", 40: "3"} {
		if got := attempt.Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestIncomingIsNotForwarded(t *testing.T) {
	ctx := attempt.NewIncomingContext(context.Background(), 2)
	if attempt.Incoming(ctx) != 2 {
		t.Fatalf("Incoming = %d", attempt.Incoming(ctx))
	}
	if attempt.Outgoing(ctx) != 0 {
		t.Fatalf("a received attempt leaked into the outgoing call: %d", attempt.Outgoing(ctx))
	}
	ctx = attempt.NewOutgoingContext(ctx, 9)
	if attempt.Outgoing(ctx) != attempt.MaxAttempts {
		t.Fatalf("Outgoing not clamped: %d", attempt.Outgoing(ctx))
	}
}

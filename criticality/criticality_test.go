package criticality_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/triagehq/triage/criticality"
)

func TestOrderIsTheBooks(t *testing.T) {
	all := criticality.All()
	want := []string{"CRITICAL_PLUS", "CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE"}
	for i, l := range all {
		if l.String() != want[i] {
			t.Errorf("All()[%d] = %v, want %s", i, l, want[i])
		}
		if i > 0 && !(all[i-1] > l) {
			t.Errorf("%v should be more critical than %v", all[i-1], l)
		}
	}
	if criticality.Default != criticality.Critical {
		t.Errorf("Default = %v, want CRITICAL (the book's default for production requests)", criticality.Default)
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    criticality.Level
		wantErr bool
	}{
		{"CRITICAL_PLUS", criticality.CriticalPlus, false},
		{"CRITICAL", criticality.Critical, false},
		{"SHEDDABLE_PLUS", criticality.SheddablePlus, false},
		{"SHEDDABLE", criticality.Sheddable, false},
		{"", criticality.Default, true},
		{"critical", criticality.Default, true},
		{" CRITICAL", criticality.Default, true},
		{"CRITICAL\x00", criticality.Default, true},
		{"CRITICAL_PLUS_PLUS", criticality.Default, true},
		{"2", criticality.Default, true},
		{strings.Repeat("A", 1<<20), criticality.Default, true},
		{"CRÍTICAL", criticality.Default, true},
	}
	for _, tt := range tests {
		name := tt.in
		if len(name) > 20 {
			name = name[:20]
		}
		t.Run(name, func(t *testing.T) {
			got, err := criticality.Parse(tt.in)
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Fatalf("Parse(%q) = %v, %v; want %v, err=%v", name, got, err, tt.want, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, criticality.ErrInvalid) {
					t.Errorf("error %v does not wrap ErrInvalid", err)
				}
				if len(err.Error()) > 200 {
					t.Errorf("error message is %d bytes; huge input must not be echoed", len(err.Error()))
				}
			}
		})
	}
}

func TestStringRoundTripAndText(t *testing.T) {
	for _, l := range criticality.All() {
		got, err := criticality.Parse(l.String())
		if err != nil || got != l {
			t.Errorf("Parse(%v.String()) = %v, %v", l, got, err)
		}
		b, err := l.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back criticality.Level
		if err := back.UnmarshalText(b); err != nil || back != l {
			t.Errorf("text round trip of %v gave %v, %v", l, back, err)
		}
	}
	if s := criticality.Level(9).String(); s != "Level(9)" {
		t.Errorf("out-of-range String() = %q", s)
	}
	if criticality.Level(4).Valid() {
		t.Error("Level(4) reported valid")
	}
	if _, err := criticality.Level(7).MarshalText(); err == nil {
		t.Error("MarshalText of an invalid level succeeded")
	}
}

func TestContext(t *testing.T) {
	ctx := context.Background()
	if _, ok := criticality.FromContext(ctx); ok {
		t.Fatal("empty context reported a level")
	}
	if got := criticality.Of(ctx); got != criticality.Default {
		t.Fatalf("Of(empty) = %v, want Default", got)
	}
	ctx1 := criticality.NewContext(ctx, criticality.Sheddable)
	if got := criticality.Of(ctx1); got != criticality.Sheddable {
		t.Fatalf("Of = %v, want SHEDDABLE", got)
	}
	if same := criticality.NewContext(ctx1, criticality.Sheddable); same != ctx1 {
		t.Error("NewContext with the level already carried made a new context")
	}
	ctx2 := criticality.NewContext(ctx1, criticality.CriticalPlus)
	if criticality.Of(ctx2) != criticality.CriticalPlus || criticality.Of(ctx1) != criticality.Sheddable {
		t.Error("override leaked into the parent or did not take")
	}
}

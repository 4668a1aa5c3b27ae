package stockrows

import "testing"

func TestParse(t *testing.T) {
	rows, err := Parse(" 5x3000, 10x600 ")
	if err != nil || len(rows) != 2 || rows[0] != (Row{5, 3000}) || rows[1] != (Row{10, 600}) {
		t.Fatalf("Parse: %v, %v", rows, err)
	}
	if rows, err := Parse(""); err != nil || rows != nil {
		t.Fatalf("empty: %v, %v", rows, err)
	}
	for _, bad := range []string{"10", "10x0", "0x50", "5x3000,x", "101x5", "5x20001", "NaNx5", "5x-1"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}

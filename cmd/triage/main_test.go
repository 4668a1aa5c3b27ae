package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunArguments(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("criticality:\n  rules:\n    - host: x.com\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badQuota := filepath.Join(t.TempDir(), "badq.yaml")
	goodQuota := filepath.Join(t.TempDir(), "goodq.yaml")
	os.WriteFile(badQuota, []byte("customers: {ads: {cpu: -1}}\n"), 0o600)
	os.WriteFile(goodQuota, []byte("customers: {ads: {cpu: 1}}\n"), 0o600)
	tests := []struct {
		args    []string
		code    int
		errText string
	}{
		{nil, 2, "Usage"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"demo", "-requests", "0"}, 2, "between 1 and 10000"},
		{[]string{"demo", "-requests", "x"}, 2, "invalid value"},
		{[]string{"demo", "-timeout", "-1s"}, 2, "must be positive"},
		{[]string{"demo", "extra"}, 2, "unexpected argument"},
		{[]string{"demo", "-config", filepath.Join(t.TempDir(), "missing.yaml")}, 1, "no such file"},
		{[]string{"demo", "-config", bad}, 1, "criticality is required"},
		{[]string{"demo", "-print-config"}, 0, ""},
		{[]string{"demo", "-requests", "1"}, 0, ""},
		{[]string{"quota-server"}, 2, "-config is required"},
		{[]string{"quota-server", "-config", filepath.Join(t.TempDir(), "missing.yaml")}, 1, "no such file"},
		{[]string{"quota-server", "-config", badQuota}, 1, "is negative"},
		{[]string{"quota-server", "-config", goodQuota, "-refresh", "10s", "-lease", "5s"}, 2, "-refresh <= -lease"},
		{[]string{"quota-server", "-config", goodQuota, "-listen", "not-an-address"}, 1, "missing port"},
	}
	for _, tt := range tests {
		var out, errb strings.Builder
		code := run(context.Background(), tt.args, &out, &errb)
		if code != tt.code || !strings.Contains(errb.String(), tt.errText) {
			t.Errorf("run(%q) = %d, stderr %q; want %d containing %q", tt.args, code, errb.String(), tt.code, tt.errText)
		}
	}
}

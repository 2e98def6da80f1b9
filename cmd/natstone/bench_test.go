package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// benchRows are the rows a full bench run reports, in order.
var benchRows = []string{
	"B-CAS", "B-WQ(1)", "B-WQ(10)", "B-PUT(2048B)", "B-REQ", "B-LOAD",
	"S1", "S2", "S3-single", "S3-batch", "B-REQ@S4", "S4", "S5", "S6", "S6-records", "S7-simple", "S7", "S8-unfiltered", "S8", "S8-many", "EV-off", "EV", "EV-off@half", "EV@half",
	"B-CAS(always)", "S9-S1", "S9-S2",
}

// TestBenchTiny runs every baseline and scenario at a tiny scale and checks the report's shape:
// every row is there with a figure, in the table and in the JSON. It asserts nothing about speed.
func TestBenchTiny(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "bench.json")
	cpuFile, blockFile := filepath.Join(dir, "s1.cpu"), filepath.Join(dir, "s1.block")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"bench", "--pending", "2000", "--s5-pending", "2000", "--s6-pending", "2000",
		"--duration", "300ms", "--workers", "4", "--json", jsonFile, "--cpuprofile", cpuFile, "--blockprofile", blockFile}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	for _, f := range []string{cpuFile, blockFile} {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			t.Errorf("profile %s: %v", f, err)
		}
	}

	// The table: a header, then one line per row whose first two fields are its name and figure.
	table := map[string]float64{}
	var order []string
	for _, line := range strings.Split(stdout.String(), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !slices.Contains(benchRows, f[0]) {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Errorf("row %s: figure %q: %v", f[0], f[1], err)
		}
		table[f[0]] = v
		order = append(order, f[0])
	}
	if !slices.Equal(order, benchRows) {
		t.Errorf("table rows %v, want %v\n%s", order, benchRows, &stdout)
	}
	for name, v := range table {
		if v == 0 {
			t.Errorf("table row %s: figure 0", name)
		}
	}

	data, err := os.ReadFile(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	var rep benchReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("--json wrote invalid JSON: %v\n%s", err, data)
	}
	var names []string
	for _, r := range rep.Rows {
		names = append(names, r.Name)
		if r.Figure == 0 {
			t.Errorf("JSON row %s: figure 0", r.Name)
		}
	}
	if !slices.Equal(names, benchRows) {
		t.Errorf("JSON rows %v, want %v", names, benchRows)
	}
	if rep.Machine == nil || rep.Machine.Cores < 1 || rep.Machine.GoVersion == "" || rep.Machine.NATSServerVersion == "" {
		t.Errorf("JSON machine info %+v", rep.Machine)
	}
	// S6 restarts from the snapshot of its clean stop, S6-records from the records, and both are
	// held to S6's target. B-LOAD keeps the faster of two reads.
	for _, r := range rep.Rows {
		switch {
		case r.Name == "S6" && !strings.Contains(r.Notes, "from the snapshot"),
			r.Name == "S6-records" && !strings.Contains(r.Notes, "from the records"),
			r.Name == "B-LOAD" && !strings.Contains(r.Notes, "the faster of two reads"):
			t.Errorf("%s: %s", r.Name, r.Notes)
		case (r.Name == "S6" || r.Name == "S6-records") && (r.Target != "<= 1.5" || r.Met == nil):
			t.Errorf("%s: target %q, met %v; want S6's", r.Name, r.Target, r.Met)
		}
	}
	if rep.Flags["pending"] != "2000" || rep.Date == "" || rep.Error != "" {
		t.Errorf("JSON flags %v, date %q, error %q", rep.Flags, rep.Date, rep.Error)
	}
	for _, r := range rep.Rows {
		if r.Target != "" && r.Baseline == "" && r.Name != "S5" {
			t.Errorf("JSON row %s has target %q but no baseline", r.Name, r.Target)
		}
	}
}

func TestBenchUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--scenarios", "S10"},
		{"bench", "--baselines", "B-NOPE"},
		{"bench", "--sync", "sometimes"},
		{"bench", "--pending", "0"},
		{"bench", "--s6-pending", "0"},
		{"bench", "--profile-phase", "S9"},
		{"bench", "extra"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != exitUsage {
			t.Errorf("%v: exit code %d, want %d\n%s", args, code, exitUsage, &stderr)
		}
	}
}

func TestPickList(t *testing.T) {
	t.Parallel()
	got, err := benchPickList("load, b-cas,WQ", benchBaselines, "B-")
	if err != nil || !slices.Equal(got, []string{"B-CAS", "B-WQ", "B-LOAD"}) {
		t.Errorf("pickList = %v, %v", got, err)
	}
	if got, err := benchPickList("none", benchBaselines, "B-"); err != nil || got != nil {
		t.Errorf("pickList(none) = %v, %v", got, err)
	}
}

// TestBenchRatioTextAgreesWithMet: a ratio that two decimals would round onto the other side of its
// target is printed with as many more as it takes.
func TestBenchRatioTextAgreesWithMet(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		ratio float64
		t     benchTarget
		want  string
	}{
		{1.503, benchAtMost(1.5), "1.503"},
		{1.5, benchAtMost(1.5), "1.50"},
		{1.4999, benchAtMost(1.5), "1.50"},
		{0.7996, benchAtLeast(0.8), "0.7996"},
		{0.80001, benchAtLeast(0.8), "0.80"},
		{0.24, benchAtLeast(1), "0.24"},
		{2.0000001, benchAtMost(2), "2.000000"}, // past six decimals: the closest it prints
		{0.123, benchTarget{}, "0.12"},
	} {
		row := &benchRow{Figure: tt.ratio}
		(&bench{}).compareValue(row, "base", 1, tt.t)
		if got := row.ratioText(); got != tt.want {
			t.Errorf("%v against %s: %q, want %q", tt.ratio, tt.t, got, tt.want)
		}
	}
}

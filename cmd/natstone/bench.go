package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
)

// Defaults of the bench flags. The full scale of the performance brief is --pending 1000000
// --s5-pending 10000000; the defaults keep a run under about five minutes on two cores.
const (
	DefaultBenchPending   = 200_000
	DefaultBenchS5Pending = 1_000_000
	DefaultBenchS6Pending = 1_000_000
	DefaultBenchWorkers   = 64
	DefaultBenchDuration  = 10 * time.Second
	DefaultBenchPayload   = 200
	DefaultBenchConns     = 4
	DefaultBenchReqRate   = 5000
)

// benchScenarios and benchBaselines list what bench can run, in the order it runs them.
var (
	benchScenarios = []string{"S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8", "EV", "S9"}
	benchBaselines = []string{"B-CAS", "B-WQ", "B-PUT", "B-REQ", "B-LOAD"}
	// benchProfilePhases are the phases --profile-phase may name.
	benchProfilePhases = []string{"S1", "S2", "S6", "S6-records", "S7-simple", "S7"}
)

// benchConfig is the parsed command line of bench.
type benchConfig struct {
	scenarios    []string
	baselines    []string
	pending      int
	s5Pending    int
	s6Pending    int
	workers      int
	duration     time.Duration
	payload      int
	syncAlways   bool
	jsonFile     string
	cpuProfile   string
	blockProfile string
	memProfile   string
	profilePhase string // the phase the profiles cover
	conns        int
	reqRate      float64
	retention    time.Duration
	flags        map[string]string // every flag's value, for the JSON report
	args         []string          // the command line after "bench"
}

func (c *benchConfig) has(list []string, name string) bool { return slices.Contains(list, name) }

// bench is one run of the bench command.
type bench struct {
	cfg     *benchConfig
	p       *benchProgress
	log     *slog.Logger
	payload string          // --payload bytes of text
	main    *benchMainQueue // the queue S1, S2 and S4 share; nil when there is none
	rows    []*benchRow
}

// runBench is the bench command.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseBenchFlags(args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage
	}
	b := &bench{cfg: cfg, p: newBenchProgress(stderr), log: benchDiscardLogger(), payload: benchPayload(cfg.payload)}
	info := newBenchMachine()
	start := time.Now()
	runErr := b.run(ctx)
	b.sortRows()
	info.LoadAvgEnd = benchLoadAvg()
	b.printTable(stdout)
	if cfg.jsonFile != "" {
		if err := b.writeJSON(cfg.jsonFile, info, start, runErr); err != nil {
			fmt.Fprintf(stderr, "natstone bench: %v\n", err)
			return exitError
		}
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "natstone bench: %v\n", runErr)
		return exitError
	}
	return exitOK
}

// benchExitCodesHelp ends bench's help.
const benchExitCodesHelp = `
Exit codes:
  0  the run ended (whether the targets were met or not: see the table)
  1  failure: a phase failed, or the JSON could not be written (the table shows what ran)
  2  bad command line: unknown flag, a bad value
`

// parseBenchFlags parses and validates the bench command line; a usage error has been reported on
// stderr when it returns.
func parseBenchFlags(args []string, stdout, stderr io.Writer) (*benchConfig, error) {
	fs := flag.NewFlagSet("natstone bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: natstone bench [flags]

Measures natstone against plain JetStream on this machine. Starts a fresh embedded nats-server with
JetStream on a temporary store, in this process, with in-process clients; runs the baselines, then
the scenarios (S5 on a server of its own, S9 on another with --sync always), and prints a table:
each figure, its latency percentiles, the CPU used (process CPU seconds per wall second), its
baseline from the same run, the ratio and its target (docs/performance.md lists the scenarios,
the baselines and the targets). Every phase is bounded in count and in time.

The targets' full scale is --pending 1000000 --s5-pending 10000000.

Flags:
`)
		printFlags(fs.Output(), fs, func(string) bool { return true })
		fmt.Fprint(fs.Output(), benchExitCodesHelp)
	}
	cfg := &benchConfig{}
	var scenarios, baselines, syncMode string
	fs.StringVar(&scenarios, "scenarios", strings.Join(benchScenarios, ","), "comma-separated `list` of scenarios to run (S4 and S7 also run S1)")
	fs.StringVar(&baselines, "baselines", strings.Join(benchBaselines, ","), "comma-separated `list` of baselines to run, or none (B-WQ is fetch 1 and fetch 10)")
	fs.IntVar(&cfg.pending, "pending", DefaultBenchPending, "pending messages of S1, S2, S4, S7, S8, S9, keys of B-CAS, messages of B-WQ, B-PUT and S3")
	fs.IntVar(&cfg.s5Pending, "s5-pending", DefaultBenchS5Pending, "pending messages of S5 (the target's scale: 10000000)")
	fs.IntVar(&cfg.s6Pending, "s6-pending", DefaultBenchS6Pending, "pending messages of S6 and keys of B-LOAD (the target's scale: 1000000)")
	fs.IntVar(&cfg.workers, "workers", DefaultBenchWorkers, "concurrent workers or clients")
	durationVar(fs, &cfg.duration, "duration", DefaultBenchDuration, "longest measured phase")
	fs.IntVar(&cfg.payload, "payload", DefaultBenchPayload, "payload and value `bytes` (S3 and B-PUT use 2048, S5 16)")
	fs.StringVar(&syncMode, "sync", "default", "JetStream sync `mode` of the main run: always or default (S9 always uses always)")
	fs.StringVar(&cfg.jsonFile, "json", "", "also write the results as JSON to `file`")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the --profile-phase to `file`")
	fs.StringVar(&cfg.blockProfile, "blockprofile", "", "write a block profile (where goroutines wait) of the --profile-phase to `file`")
	fs.StringVar(&cfg.memProfile, "memprofile", "", "write the allocations of the --profile-phase to `file` (and those before it to file.base: go tool pprof -base file.base file)")
	fs.StringVar(&cfg.profilePhase, "profile-phase", "S1", "the `phase` that --cpuprofile, --blockprofile and --memprofile cover: the measured phase of "+strings.Join(benchProfilePhases, ", ")+" (S6 and S6-records: the stop, the restart and the first dequeue)")
	fs.IntVar(&cfg.conns, "conns", DefaultBenchConns, "client connections the workers share")
	fs.Float64Var(&cfg.reqRate, "req-rate", DefaultBenchReqRate, "requests per second of B-REQ (S4's baseline is measured again at S4's rate)")
	durationVar(fs, &cfg.retention, "retention", 0, "retention of the bench queues: 0 collects each completed message at once (within about 100 ms), in the measured phase")
	if err := parseFlags(fs, args, stdout); err != nil {
		return nil, err
	}
	usageErr := func(format string, a ...any) (*benchConfig, error) {
		err := fmt.Errorf(format, a...)
		reportUsage(stderr, fs.Name(), err.Error())
		return nil, err
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if cfg.scenarios, err = benchPickList(scenarios, benchScenarios, ""); err != nil {
		return usageErr("--scenarios: %v", err)
	}
	if cfg.baselines, err = benchPickList(baselines, benchBaselines, "B-"); err != nil {
		return usageErr("--baselines: %v", err)
	}
	if i := slices.IndexFunc(benchProfilePhases, func(p string) bool { return strings.EqualFold(p, cfg.profilePhase) }); i >= 0 {
		cfg.profilePhase = benchProfilePhases[i]
	} else {
		return usageErr("--profile-phase must be one of %s, not %q", strings.Join(benchProfilePhases, ", "), cfg.profilePhase)
	}
	if (cfg.has(cfg.scenarios, "S4") || cfg.has(cfg.scenarios, "S7")) && !cfg.has(cfg.scenarios, "S1") {
		cfg.scenarios = append([]string{"S1"}, cfg.scenarios...)
	}
	switch syncMode {
	case "always":
		cfg.syncAlways = true
	case "default":
	default:
		return usageErr("--sync must be always or default, not %q", syncMode)
	}
	switch {
	case cfg.pending < 1:
		return usageErr("--pending must be at least 1")
	case cfg.s5Pending < 1:
		return usageErr("--s5-pending must be at least 1")
	case cfg.s6Pending < 1:
		return usageErr("--s6-pending must be at least 1")
	case cfg.workers < 1:
		return usageErr("--workers must be at least 1")
	case cfg.duration <= 0:
		return usageErr("--duration must be positive")
	case cfg.payload < 0 || cfg.payload > subjects.DefaultMaxPayloadBytes:
		return usageErr("--payload must be 0 to %d", subjects.DefaultMaxPayloadBytes)
	case cfg.conns < 1:
		return usageErr("--conns must be at least 1")
	case cfg.reqRate <= 0:
		return usageErr("--req-rate must be positive")
	case cfg.retention < 0 || cfg.retention > subjects.MaxRetention || cfg.retention%time.Millisecond != 0:
		return usageErr("--retention must be whole milliseconds from 0 to %v", subjects.MaxRetention)
	}
	cfg.args = args
	cfg.flags = make(map[string]string)
	fs.VisitAll(func(f *flag.Flag) { cfg.flags[f.Name] = f.Value.String() })
	return cfg, nil
}

// benchPickList parses a comma-separated selection from all, in all's order; prefix may be omitted from
// each name, and case does not matter.
func benchPickList(s string, all []string, prefix string) ([]string, error) {
	if strings.EqualFold(strings.TrimSpace(s), "none") || strings.TrimSpace(s) == "" {
		return nil, nil
	}
	want := make(map[string]bool)
	for _, tok := range strings.Split(s, ",") {
		name := strings.ToUpper(strings.TrimSpace(tok))
		if prefix != "" && !strings.HasPrefix(name, prefix) {
			name = prefix + name
		}
		if !slices.Contains(all, name) {
			return nil, fmt.Errorf("unknown name %q (have %s)", tok, strings.Join(all, ","))
		}
		want[name] = true
	}
	var out []string
	for _, name := range all {
		if want[name] {
			out = append(out, name)
		}
	}
	return out, nil
}

// benchStopTimeout bounds the shutdown of a bench server.
const benchStopTimeout = time.Minute

// run runs the selected baselines and scenarios: the baselines and S1–S8 on one server, except S5
// (memory) and S6 (restart) on servers of their own, and S9 on another with sync always.
func (b *bench) run(ctx context.Context) (err error) {
	dir, err := os.MkdirTemp("", "natstone-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var main []string
	for _, s := range b.cfg.scenarios {
		if s != "S5" && s != "S6" && s != "S9" {
			main = append(main, s)
		}
	}
	if len(main) > 0 || len(b.cfg.baselines) > 0 {
		if err := b.runMain(ctx, filepath.Join(dir, "main"), main); err != nil {
			return err
		}
	}
	if b.cfg.has(b.cfg.scenarios, "S5") {
		if err := b.s5(ctx, filepath.Join(dir, "s5")); err != nil {
			return fmt.Errorf("S5: %w", err)
		}
	}
	if b.cfg.has(b.cfg.scenarios, "S6") {
		if err := b.s6(ctx, filepath.Join(dir, "s6")); err != nil {
			return fmt.Errorf("S6: %w", err)
		}
	}
	if b.cfg.has(b.cfg.scenarios, "S9") {
		return b.s9(ctx, filepath.Join(dir, "s9"))
	}
	return nil
}

// runMain runs the baselines, then the scenarios, on one embedded server, and removes its store.
func (b *bench) runMain(ctx context.Context, dir string, scenarios []string) (err error) {
	env, err := startEnv(ctx, dir, b.cfg.syncAlways, b.cfg.conns, b.cfg.retention, b.log)
	if err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), benchStopTimeout)
		defer cancel()
		err = errors.Join(err, env.stop(stopCtx), os.RemoveAll(dir))
	}()
	for _, name := range b.cfg.baselines {
		if err := b.runBaseline(ctx, env, name); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	run := map[string]func(context.Context, *benchEnv) error{
		"S1": b.s1, "S2": b.s2, "S3": b.s3, "S4": b.s4, "S7": b.s7, "S8": b.s8, "EV": b.ev,
	}
	for _, name := range scenarios {
		if err := run[name](ctx, env); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if name == "S4" {
			// The last user of the shared queue.
			if err := b.dropSharedQueue(ctx, env); err != nil {
				return err
			}
		}
	}
	return b.dropSharedQueue(ctx, env)
}

// runBaseline runs one baseline and records its rows.
func (b *bench) runBaseline(ctx context.Context, env *benchEnv, name string) error {
	var rows []*benchRow
	switch name {
	case "B-CAS":
		row, err := b.baselineCAS(ctx, env, "B-CAS")
		if err != nil {
			return err
		}
		rows = append(rows, row)
	case "B-WQ":
		for _, batch := range []int{1, 10} {
			row, err := b.baselineWQ(ctx, env, batch)
			if err != nil {
				return err
			}
			rows = append(rows, row)
		}
	case "B-PUT":
		row, err := b.baselinePUT(ctx, env, benchS3PayloadBytes)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	case "B-REQ":
		row, err := b.baselineREQ(ctx, env, "B-REQ", b.cfg.reqRate)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	case "B-LOAD":
		row, err := b.baselineLOAD(ctx, env)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	}
	for _, row := range rows {
		b.add(row)
	}
	return nil
}

// s9 is S9: S1 and S2 with --sync always, against B-CAS in the same mode, on a server of their own.
// The queue and B-CAS's keys are filled in default mode (an fsync per write would make filling
// take minutes), then the server restarts on the same store with sync always for the measurements.
func (b *bench) s9(ctx context.Context, dir string) (err error) {
	env, err := startEnv(ctx, dir, false, b.cfg.conns, b.cfg.retention, b.log)
	if err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), benchStopTimeout)
		defer cancel()
		err = errors.Join(err, env.stop(stopCtx))
	}()
	cas, err := b.newCAS(ctx, env, "B-CAS(always)", b.cfg.pending)
	if err != nil {
		return err
	}
	cas.nc.Close()
	queue := benchQueueName("S9")
	if err := env.createQueue(ctx, queue, subjects.CreateQueueRequest{}); err != nil {
		return err
	}
	if err := env.fill(ctx, b.p, "S9 fill", queue, b.cfg.pending, b.pendingMessage); err != nil {
		return err
	}
	if _, err := env.restart(ctx, true); err != nil {
		return err
	}
	b.p.note("S9: restarted with sync always")
	if err := cas.connect(env); err != nil {
		return err
	}
	r, err := cas.updates(ctx, b, "B-CAS(always)")
	err = errors.Join(err, cas.close(ctx))
	if err != nil {
		return err
	}
	b.add(benchRateRow("B-CAS(always)", "writes/s", r, fmt.Sprintf("as B-CAS, server with sync always; %d in flight", benchWindowFor(b.cfg.pending))))
	// Both run on one queue: S9-S2 starts with what S9-S1 left (topping up with an fsync per write
	// would take longer than the measurement).
	pending := b.cfg.pending
	for _, batch := range []int{1, 10} {
		name := fmt.Sprintf("S9-S%d", min(batch, 2))
		r, err := b.cycles(ctx, env, name, queue, batch)
		if err != nil {
			return err
		}
		row := benchRateRow(name, "cycles/s", r, fmt.Sprintf("sync always; %d pending at start, %d workers, dequeue batch %d then complete each; latency: dequeue",
			pending, b.cfg.workers, batch))
		row.Kind = benchKindScenario
		b.compare(row, "B-CAS(always)", 0.5, benchTarget{})
		b.add(row)
		pending -= int(r.ops)
	}
	return env.deleteQueue(ctx, queue)
}

// Kinds of rows.
const (
	benchKindBaseline  = "baseline"
	benchKindScenario  = "scenario"
	benchKindReference = "reference" // measured alongside a scenario as its point of comparison
)

// benchRow is one line of the table and of the JSON report. Latencies are in milliseconds, zero
// when the row has none.
type benchRow struct {
	Name          string             `json:"name"`
	Kind          string             `json:"kind"`
	Figure        float64            `json:"figure"`
	Unit          string             `json:"unit"`
	Ops           int64              `json:"ops,omitempty"`
	Seconds       float64            `json:"seconds,omitempty"` // measured wall time
	P50MS         float64            `json:"p50_ms,omitempty"`
	P99MS         float64            `json:"p99_ms,omitempty"`
	P999MS        float64            `json:"p999_ms,omitempty"`
	CPU           float64            `json:"cpu"` // process CPU seconds per wall second
	Baseline      string             `json:"baseline,omitempty"`
	BaselineValue float64            `json:"baseline_value,omitempty"`
	Ratio         float64            `json:"ratio,omitempty"`
	Target        string             `json:"target,omitempty"`
	Met           *bool              `json:"met,omitempty"`
	Notes         string             `json:"notes,omitempty"`
	Extra         map[string]float64 `json:"extra,omitempty"`

	target benchTarget // what Target says, for the table's rounding
}

// benchRateRow builds the row of a throughput measurement.
func benchRateRow(name, unit string, r benchResult, notes string) *benchRow {
	if r.uncollected > 0 {
		notes += fmt.Sprintf("; %d completed messages were still to be collected when the loop ended, which took %.2fs more (in the rate)", r.uncollected, r.collectWait.Seconds())
	}
	row := &benchRow{Name: name, Kind: benchKindBaseline, Figure: r.rate(), Unit: unit, Ops: r.ops,
		Seconds: r.elapsed.Seconds(), CPU: r.cpu, Notes: notes}
	row.setLatency(r.lat)
	return row
}

func (r *benchRow) setLatency(l benchLatency) {
	r.P50MS, r.P99MS, r.P999MS = benchMS(l.P50), benchMS(l.P99), benchMS(l.P999)
}

func (r *benchRow) lat() benchLatency {
	d := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	return benchLatency{P50: d(r.P50MS), P99: d(r.P99MS), P999: d(r.P999MS)}
}

// benchTarget is a row's goal for its ratio; the zero target is "report".
type benchTarget struct {
	op string // ">=" or "<="
	v  float64
}

func benchAtLeast(v float64) benchTarget { return benchTarget{op: ">=", v: v} }
func benchAtMost(v float64) benchTarget  { return benchTarget{op: "<=", v: v} }

func (t benchTarget) String() string {
	if t.op == "" {
		return "report"
	}
	return t.op + " " + strconv.FormatFloat(t.v, 'f', -1, 64)
}

func (t benchTarget) met(ratio float64) *bool {
	switch t.op {
	case ">=":
		return benchBoolPtr(ratio >= t.v)
	case "<=":
		return benchBoolPtr(ratio <= t.v)
	}
	return nil
}

func benchBoolPtr(v bool) *bool { return &v }

func (b *bench) add(row *benchRow) { b.rows = append(b.rows, row) }

// sortRows puts the rows in the table's order: the baselines, then the scenarios from S1 to S9,
// each after the baseline or reference row measured for it alone (B-REQ@S4, S8-unfiltered,
// B-CAS(always)), with EV (and its EV-off, EV-off@half and EV@half) before S9. The scenarios do not run in that order (S5 and S9 have servers of their own).
func (b *bench) sortRows() {
	rank := func(r *benchRow) int {
		name := r.Name
		switch name {
		case "B-REQ@S4":
			return 40
		case "S8-many":
			return 82
		case "EV-off":
			return 85
		case "EV":
			return 86
		case "EV-off@half":
			return 87
		case "EV@half":
			return 88
		case "B-CAS(always)":
			return 90
		}
		if strings.HasPrefix(name, "B-") || len(name) < 2 || name[0] != 'S' || name[1] < '1' || name[1] > '9' {
			return 0
		}
		n := int(name[1]-'0') * 10
		if r.Kind == benchKindScenario {
			n++
		}
		return n
	}
	slices.SortStableFunc(b.rows, func(x, y *benchRow) int { return rank(x) - rank(y) })
}

// row returns the row called name, or nil.
func (b *bench) row(name string) *benchRow {
	for _, r := range b.rows {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// compare sets row's ratio to baseline row base's figure times factor (B-CAS/2 is factor 0.5).
func (b *bench) compare(row *benchRow, base string, factor float64, t benchTarget) {
	label := base
	if factor != 1 {
		label = fmt.Sprintf("%s/%g", base, 1/factor)
	}
	if r := b.row(base); r != nil {
		b.compareValue(row, label, r.Figure*factor, t)
		return
	}
	row.Baseline, row.Target = label+" (not run)", t.String()
}

// compareValue sets row's ratio to its figure ÷ value.
func (b *bench) compareValue(row *benchRow, label string, value float64, t benchTarget) {
	row.Baseline, row.BaselineValue, row.Target, row.target = label, value, t.String(), t
	if value != 0 {
		row.Ratio = row.Figure / value
		row.Met = t.met(row.Ratio)
	}
}

// ratioText is r's ratio to two decimals, or to as many more (up to six) as it takes for the
// printed figure to be on the same side of the target as the ratio itself: 1.503 against ≤ 1.5
// prints as 1.503, not as 1.50 next to "NO".
func (r *benchRow) ratioText() string {
	txt := strconv.FormatFloat(r.Ratio, 'f', 2, 64)
	if r.Met == nil || r.target.op == "" {
		return txt
	}
	for d := 2; d <= 6; d++ {
		txt = strconv.FormatFloat(r.Ratio, 'f', d, 64)
		if v, err := strconv.ParseFloat(txt, 64); err == nil && *r.target.met(v) == *r.Met {
			break
		}
	}
	return txt
}

// printTable writes the rows as an aligned table, then each row's notes.
func (b *bench) printTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tfigure\tunit\tp50 ms\tp99 ms\tp999 ms\tCPU\tbaseline\tbaseline figure\tratio\ttarget\tmet?\t")
	num := func(v float64) string {
		switch {
		case v == 0:
			return "-"
		case v >= 1000 || v <= -1000:
			return strconv.FormatFloat(v, 'f', 0, 64)
		case v >= 100 || v <= -100:
			return strconv.FormatFloat(v, 'f', 1, 64)
		default:
			return strconv.FormatFloat(v, 'f', 3, 64)
		}
	}
	for _, r := range b.rows {
		met := "-"
		if r.Met != nil {
			met = map[bool]string{true: "yes", false: "NO"}[*r.Met]
		}
		ratio := "-"
		if r.Baseline != "" && r.BaselineValue != 0 {
			ratio = r.ratioText()
		}
		tgt := r.Target
		if tgt == "" {
			tgt = "-"
		}
		base := r.Baseline
		if base == "" {
			base = "-"
		}
		cpu := "-"
		if r.CPU != 0 {
			cpu = strconv.FormatFloat(r.CPU, 'f', 2, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Name, num(r.Figure), r.Unit,
			num(r.P50MS), num(r.P99MS), num(r.P999MS), cpu, base, num(r.BaselineValue), ratio, tgt, met)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	for _, r := range b.rows {
		if r.Notes != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Name, r.Notes)
		}
	}
}

// benchMachine describes where a run happened.
type benchMachine struct {
	Cores             int    `json:"cores"`
	MemTotalBytes     int64  `json:"mem_total_bytes"`
	CPUModel          string `json:"cpu_model,omitempty"`
	OS                string `json:"os"`
	Arch              string `json:"arch"`
	GoVersion         string `json:"go_version"`
	NATSServerVersion string `json:"nats_server_version"`
	NatstoneVersion   string `json:"natstone_version"`
	Commit            string `json:"commit,omitempty"`         // the build's Git commit, -dirty if the checkout had changes
	LoadAvgStart      string `json:"load_avg_start,omitempty"` // /proc/loadavg: other work on the machine
	LoadAvgEnd        string `json:"load_avg_end,omitempty"`
}

func newBenchMachine() *benchMachine {
	return &benchMachine{
		Cores:             runtime.NumCPU(),
		MemTotalBytes:     benchMemTotal(),
		CPUModel:          benchProcField("/proc/cpuinfo", "model name"),
		OS:                runtime.GOOS,
		Arch:              runtime.GOARCH,
		GoVersion:         runtime.Version(),
		NATSServerVersion: server.VERSION,
		NatstoneVersion:   broker.Version,
		Commit:            buildCommit(),
		LoadAvgStart:      benchLoadAvg(),
	}
}

// benchProcField returns the value of the first "key: value" line of file whose key is key.
func benchProcField(file, key string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// benchMemTotal returns MemTotal of /proc/meminfo in bytes, or 0.
func benchMemTotal() int64 {
	v := strings.TrimSuffix(benchProcField("/proc/meminfo", "MemTotal"), " kB")
	kb, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return 0
	}
	return kb * 1024
}

func benchLoadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// benchReport is the JSON form of a run.
type benchReport struct {
	Date         string            `json:"date"`
	Command      string            `json:"command"`
	Flags        map[string]string `json:"flags"`
	Machine      *benchMachine     `json:"machine"`
	TotalSeconds float64           `json:"total_seconds"`
	Error        string            `json:"error,omitempty"`
	Rows         []*benchRow       `json:"rows"`
}

// writeJSON writes the report to file.
func (b *bench) writeJSON(file string, info *benchMachine, start time.Time, runErr error) error {
	rep := benchReport{
		Date:         start.UTC().Format(time.RFC3339),
		Command:      strings.Join(append([]string{"natstone", "bench"}, b.cfg.args...), " "),
		Flags:        b.cfg.flags,
		Machine:      info,
		TotalSeconds: time.Since(start).Seconds(),
		Rows:         b.rows,
	}
	if runErr != nil {
		rep.Error = runErr.Error()
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(data, '\n'), 0o644)
}

package index

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// mk builds a record; meta is "k=v" strings.
func mk(name string, prio int64, seq uint64, value string, meta ...string) *rec {
	r := &rec{name: name}
	r.Priority, r.Seq = prio, seq
	var pairs []Pair
	for _, m := range meta {
		k, v, _ := strings.Cut(m, "=")
		pairs = append(pairs, Pair{k, v})
	}
	r.SetAttrs(pairs, value)
	return r
}

func filter(pairs ...string) Filter {
	var f Filter
	for _, m := range pairs {
		k, v, _ := strings.Cut(m, "=")
		f = append(f, Pair{k, v})
	}
	return f
}

func names(rs []*rec) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.name)
	}
	return out
}

// build returns an index holding rs, failing t on any refused Add.
func build(t *testing.T, exclusive bool, rs ...*rec) *Index[*rec] {
	t.Helper()
	x := New[*rec](exclusive)
	for _, r := range rs {
		if !x.Add(r) {
			t.Fatalf("Add(%s) = false", r.name)
		}
	}
	mustCheck(t, x)
	return x
}

func mustCheck(t *testing.T, x *Index[*rec]) {
	t.Helper()
	if err := x.check(); err != nil {
		t.Fatal(err)
	}
}

func TestEDFOrder(t *testing.T) {
	tests := []struct {
		name string
		recs []*rec
		want []string
	}{
		{"empty", nil, []string{}},
		{"priority", []*rec{mk("c", 3, 1, ""), mk("a", 1, 2, ""), mk("b", 2, 3, "")}, []string{"a", "b", "c"}},
		{"ties by seq", []*rec{mk("s3", 5, 3, ""), mk("s1", 5, 1, ""), mk("s2", 5, 2, "")}, []string{"s1", "s2", "s3"}},
		{"negative priorities", []*rec{mk("z", 0, 1, ""), mk("neg", -7, 9, ""), mk("max", 1<<62, 0, "")}, []string{"neg", "z", "max"}},
		{"mixed", []*rec{mk("b2", 2, 20, ""), mk("a9", 1, 9, ""), mk("b1", 2, 10, ""), mk("a8", 1, 8, "")}, []string{"a8", "a9", "b1", "b2"}},
	}
	for _, tt := range tests {
		for _, exclusive := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/exclusive=%v", tt.name, exclusive), func(t *testing.T) {
				x := build(t, exclusive, tt.recs...)
				if exclusive {
					// Distinct values so exclusivity does not interfere.
					for i, r := range tt.recs {
						x.Remove(r)
						r.SetAttrs(r.Meta(), string(rune('A'+i)))
						x.Add(r)
					}
				}
				var ascended []string
				x.Ascend(nil, func(r *rec) bool { ascended = append(ascended, r.name); return true })
				if len(tt.want) > 0 && !slices.Equal(ascended, tt.want) {
					t.Errorf("Ascend = %v, want %v", ascended, tt.want)
				}
				if got := names(x.Peek(nil, 100)); !slices.Equal(got, tt.want) {
					t.Errorf("Peek = %v, want %v", got, tt.want)
				}
				var popped []string
				for x.Len() > 0 {
					p := x.Pop(nil, 1)
					if len(p) != 1 {
						t.Fatalf("Pop(nil, 1) = %v with Len %d", names(p), x.Len())
					}
					popped = append(popped, p[0].name)
					x.Release(p[0].Value())
					mustCheck(t, x)
				}
				if !slices.Equal(popped, tt.want) {
					t.Errorf("Pop one by one = %v, want %v", popped, tt.want)
				}
			})
		}
	}
}

// filterRecs carries every combination of four pairs, one record per subset,
// plus a record with a different value for key a.
func filterRecs() []*rec {
	var rs []*rec
	keys := []string{"a=1", "b=2", "c=3", "d=4"}
	for mask := 0; mask < 16; mask++ {
		var meta []string
		name := "r"
		for i, k := range keys {
			if mask&(1<<i) != 0 {
				meta = append(meta, k)
				name += k[:1]
			}
		}
		rs = append(rs, mk(name, int64(16-mask), uint64(mask), "", meta...))
	}
	return append(rs, mk("other", 0, 100, "", "a=9", "b=2"))
}

func TestFilters(t *testing.T) {
	tests := []struct {
		name   string
		filter Filter
		want   []string // in EDF order (priority 16-mask: more pairs first)
	}{
		{"one pair", filter("d=4"), []string{"rabcd", "rbcd", "racd", "rcd", "rabd", "rbd", "rad", "rd"}},
		{"two pairs", filter("a=1", "b=2"), []string{"rabcd", "rabd", "rabc", "rab"}},
		{"three pairs", filter("a=1", "b=2", "c=3"), []string{"rabcd", "rabc"}},
		{"four pairs", filter("d=4", "c=3", "b=2", "a=1"), []string{"rabcd"}},
		{"other value of key", filter("a=9"), []string{"other"}},
		{"other value plus pair", filter("b=2", "a=9"), []string{"other"}},
		{"absent pair", filter("e=5"), nil},
		{"absent value", filter("a=2"), nil},
		{"absent among present", filter("a=1", "b=2", "zz=0"), nil},
		{"conflicting values", filter("a=1", "a=9"), nil},
		{"duplicate pair", filter("c=3", "c=3", "d=4", "a=1", "b=2"), []string{"rabcd"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := build(t, false, filterRecs()...)
			if got := x.Count(tt.filter); got != len(tt.want) {
				t.Errorf("Count = %d, want %d", got, len(tt.want))
			}
			var ascended []string
			x.Ascend(tt.filter, func(r *rec) bool { ascended = append(ascended, r.name); return true })
			if !slices.Equal(ascended, tt.want) {
				t.Errorf("Ascend = %v, want %v", ascended, tt.want)
			}
			if got := x.Peek(tt.filter, 2); !slices.Equal(names(got), firstN(tt.want, 2)) {
				t.Errorf("Peek(2) = %v, want %v", names(got), firstN(tt.want, 2))
			}
			before := x.Len()
			got := x.Pop(tt.filter, 100)
			if !slices.Equal(names(got), tt.want) && !(len(got) == 0 && len(tt.want) == 0) {
				t.Errorf("Pop = %v, want %v", names(got), tt.want)
			}
			if x.Len() != before-len(tt.want) || x.Count(tt.filter) != 0 {
				t.Errorf("after Pop: Len %d (was %d), Count %d", x.Len(), before, x.Count(tt.filter))
			}
			mustCheck(t, x)
		})
	}
}

func firstN(s []string, n int) []string {
	out := []string{}
	return append(out, s[:min(n, len(s))]...)
}

func TestExclusive(t *testing.T) {
	type step struct {
		op     string // pop, peek, hold, release, remove, add
		arg    string // value for hold/release, record name for remove/add
		filter Filter
		n      int
		want   []string // pop/peek result
	}
	tests := []struct {
		name  string
		recs  []*rec
		steps []step
	}{
		{
			// Timestone figure 5: msg_0 of project foo is running, so foo is
			// held; msg_1 (foo) is more urgent than msg_2 (bar) but only
			// msg_2 may be leased.
			name: "figure 5",
			recs: []*rec{
				mk("msg_0", 0, 0, "foo", "project=foo"),
				mk("msg_1", 1, 1, "foo", "project=foo"),
				mk("msg_2", 2, 2, "bar", "project=bar"),
			},
			steps: []step{
				{op: "pop", n: 1, want: []string{"msg_0"}},
				{op: "peek", n: 5, want: []string{"msg_2"}},
				{op: "pop", n: 1, want: []string{"msg_2"}},
				{op: "pop", n: 1, want: nil},
				{op: "release", arg: "foo"},
				{op: "pop", n: 1, want: []string{"msg_1"}},
			},
		},
		{
			name: "figure 5 via Hold",
			recs: []*rec{
				mk("msg_1", 1, 1, "foo", "project=foo"),
				mk("msg_2", 2, 2, "bar", "project=bar"),
			},
			steps: []step{
				{op: "hold", arg: "foo"},
				{op: "pop", n: 1, want: []string{"msg_2"}},
			},
		},
		{
			name: "hold and release make the best eligible again",
			recs: []*rec{
				mk("f1", 1, 1, "foo"), mk("f2", 2, 2, "foo"),
				mk("b3", 3, 3, "bar"),
			},
			steps: []step{
				{op: "hold", arg: "foo"},
				{op: "hold", arg: "foo"}, // counted: two releases end it
				{op: "peek", n: 3, want: []string{"b3"}},
				{op: "release", arg: "foo"},
				{op: "peek", n: 3, want: []string{"b3"}},
				{op: "release", arg: "foo"},
				{op: "release", arg: "foo"}, // not held: nothing
				{op: "peek", n: 3, want: []string{"f1", "b3"}},
				{op: "hold", arg: "nobody"}, // a value with no messages
				{op: "peek", n: 3, want: []string{"f1", "b3"}},
				{op: "pop", n: 3, want: []string{"f1", "b3"}},
				{op: "pop", n: 3, want: nil},
				{op: "release", arg: "foo"},
				{op: "pop", n: 3, want: []string{"f2"}},
			},
		},
		{
			name: "two per value: a batch takes two of a value, in EDF order among the others, then the value is full",
			recs: []*rec{
				mk("f1", 1, 1, "foo"), mk("f2", 2, 2, "foo"), mk("f3", 3, 3, "foo", "k=v"),
				mk("b4", 4, 4, "bar"),
			},
			steps: []step{
				{op: "per", n: 2},
				{op: "peek", n: 2, want: []string{"f1", "f2"}},
				{op: "peek", n: 3, filter: Filter{{Key: "k", Value: "v"}}, want: []string{"f3"}},
				{op: "pop", n: 4, want: []string{"f1", "f2", "b4"}},
				{op: "peek", n: 3, want: nil}, // foo full
				{op: "release", arg: "foo"},
				{op: "peek", n: 3, want: []string{"f3"}},
				{op: "hold", arg: "foo"},
				{op: "per", n: 1}, // two holds: full until both end
				{op: "release", arg: "foo"},
				{op: "peek", n: 3, want: nil},
				{op: "peek", n: 3, filter: Filter{{Key: "k", Value: "v"}}, want: nil},
				{op: "per", n: 3},
				{op: "peek", n: 3, want: []string{"f3"}},
				{op: "peek", n: 3, filter: Filter{{Key: "k", Value: "v"}}, want: []string{"f3"}},
				{op: "per", n: 1},
				{op: "release", arg: "foo"},
				{op: "peek", n: 3, want: []string{"f3"}},
			},
		},
		{
			name: "three per value, one held: a batch takes two of it; filtered alike",
			recs: []*rec{
				mk("f1", 1, 1, "foo", "t=x"), mk("f2", 2, 2, "foo", "t=x"), mk("f3", 3, 3, "foo", "t=x"),
				mk("b4", 4, 4, "bar", "t=x"), mk("f5", 5, 5, "foo", "t=x"),
			},
			steps: []step{
				{op: "per", n: 3},
				{op: "hold", arg: "foo"},
				{op: "peek", n: 5, filter: filter("t=x"), want: []string{"f1", "f2", "b4"}},
				{op: "pop", n: 5, want: []string{"f1", "f2", "b4"}},
				{op: "release", arg: "foo"},
				{op: "pop", n: 5, filter: filter("t=x"), want: []string{"f3"}},
				{op: "release", arg: "foo"},
				{op: "release", arg: "foo"},
				{op: "pop", n: 1, want: []string{"f5"}},
			},
		},
		{
			name: "batch holds one per value",
			recs: []*rec{
				mk("f1", 1, 1, "foo", "t=x"), mk("f2", 2, 2, "foo", "t=x"), mk("f3", 3, 3, "foo", "t=x"),
				mk("b4", 4, 4, "bar", "t=x"), mk("b5", 5, 5, "bar", "t=x"),
				mk("z6", 6, 6, "baz", "t=y"),
			},
			steps: []step{
				{op: "peek", filter: filter("t=x"), n: 10, want: []string{"f1", "b4"}},
				{op: "pop", n: 10, want: []string{"f1", "b4", "z6"}},
				{op: "pop", n: 10, want: nil},
				{op: "pop", filter: filter("t=x"), n: 10, want: nil},
				{op: "release", arg: "foo"},
				{op: "release", arg: "bar"},
				{op: "pop", filter: filter("t=x"), n: 10, want: []string{"f2", "b5"}},
			},
		},
		{
			name: "filtered pop skips held values",
			recs: []*rec{
				mk("f1", 1, 1, "foo", "t=x"), mk("b2", 2, 2, "bar", "t=y"), mk("b3", 3, 3, "bar", "t=x"),
			},
			steps: []step{
				{op: "pop", filter: filter("t=y"), n: 1, want: []string{"b2"}},
				{op: "pop", filter: filter("t=x"), n: 5, want: []string{"f1"}},
				{op: "release", arg: "bar"},
				{op: "pop", filter: filter("t=x"), n: 5, want: []string{"b3"}},
			},
		},
		{
			name: "remove a value's head",
			recs: []*rec{
				mk("f1", 1, 1, "foo"), mk("f4", 4, 4, "foo"),
				mk("b2", 2, 2, "bar"), mk("b3", 3, 3, "bar"),
			},
			steps: []step{
				{op: "remove", arg: "f1"},
				{op: "peek", n: 5, want: []string{"b2", "f4"}},
				{op: "hold", arg: "bar"},
				{op: "remove", arg: "b2"}, // head of a held value
				{op: "peek", n: 5, want: []string{"f4"}},
				{op: "release", arg: "bar"},
				{op: "peek", n: 5, want: []string{"b3", "f4"}},
				{op: "remove", arg: "f4"}, // last message of foo
				{op: "add", arg: "f1"},
				{op: "pop", n: 5, want: []string{"f1", "b3"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := build(t, true, tt.recs...)
			byName := map[string]*rec{}
			for _, r := range tt.recs {
				byName[r.name] = r
			}
			for i, s := range tt.steps {
				switch s.op {
				case "pop", "peek":
					var got []*rec
					if s.op == "pop" {
						got = x.Pop(s.filter, s.n)
					} else {
						got = x.Peek(s.filter, s.n)
					}
					if !slices.Equal(names(got), s.want) && !(len(got) == 0 && len(s.want) == 0) {
						t.Fatalf("step %d: %s(%v, %d) = %v, want %v", i, s.op, s.filter, s.n, names(got), s.want)
					}
					if s.op == "pop" {
						for _, r := range got {
							if x.Holds(r.Value()) == 0 {
								t.Fatalf("step %d: value %q of popped %s not held", i, r.Value(), r.name)
							}
						}
					}
				case "hold":
					before := x.Holds(s.arg)
					x.Hold(s.arg)
					if x.Holds(s.arg) != before+1 {
						t.Fatalf("step %d: Holds(%q) %d after Hold, want %d", i, s.arg, x.Holds(s.arg), before+1)
					}
				case "release":
					before := x.Holds(s.arg)
					x.Release(s.arg)
					if want := max(before-1, 0); x.Holds(s.arg) != want {
						t.Fatalf("step %d: Holds(%q) %d after Release, want %d", i, s.arg, x.Holds(s.arg), want)
					}
				case "per":
					x.SetPerValue(s.n)
				case "remove":
					if !x.Remove(byName[s.arg]) {
						t.Fatalf("step %d: Remove(%s) = false", i, s.arg)
					}
				case "add":
					if !x.Add(byName[s.arg]) {
						t.Fatalf("step %d: Add(%s) = false", i, s.arg)
					}
				}
				mustCheck(t, x)
			}
		})
	}
}

func TestHeldCount(t *testing.T) {
	x := build(t, true, mk("f", 1, 1, "foo"), mk("b", 2, 2, "bar"))
	x.Hold("foo")
	x.Hold("foo")
	x.Hold("ghost")
	if got := x.HeldCount(); got != 2 {
		t.Fatalf("HeldCount = %d, want 2", got)
	}
	x.Pop(nil, 5) // holds bar
	if got := x.HeldCount(); got != 3 {
		t.Fatalf("HeldCount = %d, want 3", got)
	}
	x.Release("ghost")
	x.Release("ghost")
	x.Release("never")
	if got := x.HeldCount(); got != 2 || x.Held("ghost") {
		t.Fatalf("HeldCount = %d, Held(ghost) = %v", got, x.Held("ghost"))
	}
	mustCheck(t, x)

	s := build(t, false, mk("f", 1, 1, "foo"), mk("f2", 2, 2, "foo"))
	s.Hold("foo")
	if s.Held("foo") || s.HeldCount() != 0 {
		t.Fatal("simple index holds values")
	}
	if got := names(s.Pop(nil, 5)); !slices.Equal(got, []string{"f", "f2"}) {
		t.Fatalf("simple Pop = %v, want both messages of one value", got)
	}
}

func TestCount(t *testing.T) {
	rs := []*rec{
		mk("a", 1, 1, "foo", "t=x", "r=eu"),
		mk("b", 2, 2, "foo", "t=x", "r=us"),
		mk("c", 3, 3, "bar", "t=y", "r=eu"),
		mk("d", 4, 4, "bar", "t=x", "r=eu"),
	}
	tests := []struct {
		filter Filter
		want   int
	}{
		{nil, 4},
		{Filter{}, 4},
		{filter("t=x"), 3},
		{filter("r=eu"), 3},
		{filter("t=x", "r=eu"), 2},
		{filter("t=y", "r=us"), 0},
		{filter("t=z"), 0},
	}
	for _, exclusive := range []bool{false, true} {
		x := build(t, exclusive, rs...)
		x.Hold("foo") // held values' messages still count
		for _, tt := range tests {
			if got := x.Count(tt.filter); got != tt.want {
				t.Errorf("exclusive=%v Count(%v) = %d, want %d", exclusive, tt.filter, got, tt.want)
			}
		}
	}
}

func TestPeekEqualsPop(t *testing.T) {
	var rs []*rec
	for i := range 200 {
		meta := []string{"m=" + string(rune('a'+i%3))}
		if i%5 == 0 {
			meta = append(meta, "five=yes")
		}
		rs = append(rs, mk("r", int64(i*7919%13), uint64(i), string(rune('A'+i%11)), meta...))
	}
	filters := []Filter{nil, filter("m=a"), filter("five=yes"), filter("m=b", "five=yes"), filter("m=q")}
	for _, exclusive := range []bool{false, true} {
		for _, f := range filters {
			for _, n := range []int{1, 3, 10, 1000} {
				x := build(t, exclusive, rs...)
				x.Hold("C")
				x.Hold("D")
				for x.Len() > 0 {
					peeked := x.Peek(f, n)
					popped := x.Pop(f, n)
					if !slices.Equal(peeked, popped) {
						t.Fatalf("exclusive=%v filter=%v n=%d: Peek %v != Pop %v", exclusive, f, n, peeked, popped)
					}
					mustCheck(t, x)
					if len(popped) == 0 {
						break
					}
					for _, r := range popped {
						x.Release(r.Value())
					}
				}
			}
		}
	}
}

func TestMisuse(t *testing.T) {
	x := New[*rec](true)
	a := mk("a", 1, 1, "foo", "k=v")
	twin := mk("twin", 1, 1, "bar", "k=v") // same key as a
	if !x.Add(a) || x.Add(a) {
		t.Fatal("second Add of the same element accepted")
	}
	if x.Add(twin) || x.Contains(twin) || !x.Contains(a) {
		t.Fatal("element with a duplicate key accepted or displaced the original")
	}
	if x.Remove(twin) || !x.Contains(a) {
		t.Fatal("Remove of an absent element with a present key removed something")
	}
	if x.Add(nil) || x.Remove(nil) || x.Contains(nil) {
		t.Fatal("nil element accepted")
	}
	if x.Pop(nil, 0) != nil || x.Pop(nil, -1) != nil || x.Peek(nil, 0) != nil {
		t.Fatal("n <= 0 returned messages")
	}
	x.Ascend(nil, nil)
	b := mk("b", 2, 2, "baz")
	x.Ascend(nil, func(r *rec) bool {
		if x.Add(b) || x.Remove(a) || x.Pop(nil, 1) != nil {
			t.Error("mutation accepted during Ascend")
		}
		x.Hold("foo")
		x.Release("foo")
		return true
	})
	mustCheck(t, x)
	if !x.Remove(a) || x.Remove(a) || x.Len() != 0 {
		t.Fatal("Remove misbehaved")
	}
	mustCheck(t, x)

	var zero Index[*rec] // the zero Index is a usable simple index
	if zero.Len() != 0 || zero.Count(filter("k=v")) != 0 || zero.Pop(nil, 1) != nil || zero.Remove(a) || zero.Contains(a) {
		t.Fatal("empty zero Index misbehaved")
	}
	zero.Hold("foo")
	zero.Release("foo")
	if !zero.Add(a) || zero.Pop(filter("k=v"), 1)[0] != a {
		t.Fatal("zero Index did not work")
	}
}

// TestLarge crosses the slice/tree threshold in every kind of set.
func TestLarge(t *testing.T) {
	for _, exclusive := range []bool{false, true} {
		x := New[*rec](exclusive)
		var rs []*rec
		for i := range 3000 {
			r := mk("r", int64(i%17), uint64(i), string(rune('A'+i%300)), "m="+string(rune('a'+i%7)))
			rs = append(rs, r)
			x.Add(r)
		}
		mustCheck(t, x)
		for i, r := range rs {
			if i%3 == 0 {
				x.Remove(r)
			}
		}
		mustCheck(t, x)
		for x.Len() > 0 {
			got := x.Pop(filter("m=c"), 7)
			got = append(got, x.Pop(nil, 5)...)
			if len(got) == 0 {
				t.Fatalf("exclusive=%v: nothing popped with Len %d", exclusive, x.Len())
			}
			for _, r := range got {
				x.Release(r.Value())
			}
		}
		mustCheck(t, x)
		if len(x.pairs) != 0 || len(x.groups) != 0 || x.all.rest != nil {
			t.Fatalf("exclusive=%v: state left behind in an empty index", exclusive)
		}
	}
}

// TestEpochWrap checks that a mark left 2^32 calls ago cannot make a value
// look already picked once the epoch counter wraps.
func TestEpochWrap(t *testing.T) {
	x := build(t, true, mk("a1", 1, 1, "a", "t=x"), mk("a2", 2, 2, "a", "t=x"))
	x.epoch = ^uint32(0)
	x.groups["a"].mark = 1 // what the wrapped counter would produce next
	if got := names(x.Peek(filter("t=x"), 5)); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("Peek after wrap = %v, want [a1]", got)
	}
	if x.epoch != 1 {
		t.Fatalf("epoch = %d after wrap, want 1", x.epoch)
	}
}

// TestItemAttrs: Meta and Value read back what SetAttrs set, and an Item with
// neither keeps nothing out of line.
func TestItemAttrs(t *testing.T) {
	var it Item
	if it.Meta() != nil || it.Value() != "" {
		t.Fatalf("zero Item: Meta %v, Value %q; want none", it.Meta(), it.Value())
	}
	meta := []Pair{{"k", "v"}}
	for _, tc := range []struct {
		meta    []Pair
		value   string
		noAttrs bool
		comment string
	}{
		{meta, "x", false, "both"},
		{meta, "", false, "meta only"},
		{nil, "x", false, "value only"},
		{nil, "", true, "neither"},
		{[]Pair{}, "", true, "empty meta"},
	} {
		it.SetAttrs(tc.meta, tc.value)
		if !slices.Equal(it.Meta(), tc.meta) || it.Value() != tc.value {
			t.Errorf("%s: Meta %v, Value %q; want %v, %q", tc.comment, it.Meta(), it.Value(), tc.meta, tc.value)
		}
		if (it.attrs == nil) != tc.noAttrs {
			t.Errorf("%s: attrs allocated: %v, want %v", tc.comment, it.attrs != nil, !tc.noAttrs)
		}
	}
}

// TestFilterSetsBounded: the filter sets kept are at most maxFilters, and hold at most as many
// messages in all as are pending (or the budget's floor): the least recently used go first, the
// one just built stays. Their sets stay right as messages come and go.
func TestFilterSetsBounded(t *testing.T) {
	t.Parallel()
	var rs []*rec
	for i := range 10 {
		rs = append(rs, mk(fmt.Sprint("m", i), int64(i), uint64(i), "", "a=1", "b=1", "c=1", fmt.Sprint("d=", i%2)))
	}
	setFor := func(x *Index[*rec], f Filter) {
		x.buildFilterSet(filterKey(f), f, x.smallest(f))
		mustCheck(t, x)
	}
	ab, ac, bc, ad := filter("a=1", "b=1"), filter("a=1", "c=1"), filter("b=1", "c=1"), filter("a=1", "d=0")

	// By size: each of ab, ac and bc holds all 10 messages, and 10 are pending.
	x := build(t, false, rs...)
	x.filterBudget = 1
	setFor(x, ab)
	setFor(x, ac)
	if got := slices.Sorted(maps.Keys(x.filters)); !slices.Equal(got, []string{filterKey(ac)}) {
		t.Fatalf("after ab and ac, sets %v; want ac's alone (20 messages in sets, 10 pending)", got)
	}
	setFor(x, ad) // 5 more: 15 > 10, ac goes
	if got := slices.Sorted(maps.Keys(x.filters)); !slices.Equal(got, []string{filterKey(ad)}) {
		t.Fatalf("after ad, sets %v; want ad's alone", got)
	}

	// By number, under a budget that holds them all.
	x = build(t, false, rs...)
	x.maxFilters = 2
	for _, f := range []Filter{ab, ac, bc} {
		setFor(x, f)
	}
	if got, want := slices.Sorted(maps.Keys(x.filters)), slices.Sorted(slices.Values([]string{filterKey(ac), filterKey(bc)})); !slices.Equal(got, want) {
		t.Fatalf("sets %v; want %v, the two used last", got, want)
	}
	// The kept sets follow the messages.
	x.Add(mk("n", -1, 100, "", "b=1", "c=1"))
	x.Add(mk("o", -2, 101, "", "a=1", "c=1"))
	x.Remove(rs[0])
	mustCheck(t, x)
	if got := names(x.Peek(bc, 3)); !slices.Equal(got, []string{"n", "m1", "m2"}) {
		t.Errorf("Peek(b=1, c=1, 3) = %v", got)
	}
	if got := names(x.Peek(ac, 2)); !slices.Equal(got, []string{"o", "m1"}) {
		t.Errorf("Peek(a=1, c=1, 2) = %v", got)
	}
}

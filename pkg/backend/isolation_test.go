package backend

import (
	"errors"
	"fmt"
	"testing"
)

func TestIsolationLevels(t *testing.T) {
	order := []Isolation{IsolationNone, IsolationGrant, IsolationFiber}
	for i, a := range order {
		for j, b := range order {
			if got := a.AtLeast(b); got != (i >= j) {
				t.Errorf("%s.AtLeast(%s) = %v", a, b, got)
			}
		}
		if p, err := ParseIsolation(string(a)); err != nil || p != a {
			t.Errorf("ParseIsolation(%q) = %q, %v", a, p, err)
		}
	}
	if Isolation("").String() != "none" || !Isolation("").AtLeast(IsolationNone) || Isolation("").AtLeast(IsolationGrant) {
		t.Error("the zero Isolation is not none")
	}
	if _, err := ParseIsolation("full"); err == nil {
		t.Error("ParseIsolation accepted full")
	}
	if Isolation("full").AtLeast(IsolationNone) {
		t.Error("an unknown level counts as isolation")
	}
	if least(IsolationFiber, IsolationGrant) != IsolationGrant || least(IsolationNone, IsolationFiber) != IsolationNone {
		t.Error("least")
	}
	if err := (Config{Isolation: "full"}).Validate(); err == nil {
		t.Error("Config.Validate accepted isolation full")
	}
	if d := (Config{}).withDefaults(); d.Isolation != IsolationNone {
		t.Errorf("default isolation %q, want none", d.Isolation)
	}
}

func TestNewIDPool(t *testing.T) {
	for _, tt := range []struct {
		first, count uint32
		ok           bool
	}{
		{DefaultIDFirst, DefaultIDCount, true},
		{1000, 2, true},
		{1000, 1, false},
		{0, 10, false},
		{10, 0, false},
		{1<<32 - 10, 10, false},
		{1<<32 - 11, 10, true},
	} {
		if _, err := NewIDPool(tt.first, tt.count); (err == nil) != tt.ok {
			t.Errorf("NewIDPool(%d, %d) = %v, want ok %v", tt.first, tt.count, err, tt.ok)
		}
	}
}

// TestIDPool: a grant keeps its id while held (and gets the same again
// later), two grants never share one (nor one's id the other's root id),
// the last release frees it, and a full pool says so.
func TestIDPool(t *testing.T) {
	p, err := NewIDPool(5000, 7) // three pairs; the seventh id is never used
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.acquire("a")
	if err != nil || a < 5000 || rootID(a) >= 5006 {
		t.Fatalf("acquire a = %d, %v", a, err)
	}
	if again, _ := p.acquire("a"); again != a {
		t.Fatalf("a second hold of a got %d, want %d", again, a)
	}
	seen := map[uint32]string{a: "a", rootID(a): "a"}
	for _, g := range []string{"b", "c"} {
		id, err := p.acquire(g)
		if err != nil {
			t.Fatalf("acquire %s: %v", g, err)
		}
		for _, u := range []uint32{id, rootID(id)} {
			if o, dup := seen[u]; dup {
				t.Fatalf("%s and %s share id %d", g, o, u)
			}
			seen[u] = g
		}
	}
	if _, err := p.acquire("d"); !errors.Is(err, ErrNoIDs) {
		t.Fatalf("acquire from a full pool: %v, want ErrNoIDs", err)
	}
	p.release("a")
	if _, err := p.acquire("d"); !errors.Is(err, ErrNoIDs) {
		t.Fatal("a's id freed while a still held it once")
	}
	p.release("a")
	d, err := p.acquire("d")
	if err != nil || d != a {
		t.Fatalf("acquire d after a left = %d, %v; want a's %d", d, err, a)
	}
	p.release("nobody") // no effect
	p.release("d")
	if again, _ := p.acquire("a"); again != a {
		t.Errorf("a came back to %d, want its id %d again", again, a)
	}
}

func TestIDPoolSpreads(t *testing.T) {
	p, err := NewIDPool(DefaultIDFirst, DefaultIDCount)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[uint32]bool{}
	for i := 0; i < 1000; i++ {
		id, err := p.acquire(fmt.Sprintf("grant-%d", i))
		if err != nil || ids[id] || ids[rootID(id)] {
			t.Fatalf("grant %d: id %d, %v (taken before: %v)", i, id, err, ids[id] || ids[rootID(id)])
		}
		ids[id], ids[rootID(id)] = true, true
	}
}

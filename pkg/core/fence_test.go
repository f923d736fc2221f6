package core

import (
	"errors"
	"testing"
)

func TestFenceStringRoundTrip(t *testing.T) {
	f := Fence{GrantUID: "g-1", Epoch: 7, Seq: 42}
	if got, want := f.String(), "g-1/7/42"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	back, err := ParseFence(f.String())
	if err != nil || back != f {
		t.Fatalf("ParseFence(%q) = %+v, %v; want %+v", f.String(), back, err, f)
	}
}

func TestParseFenceRefusesMalformed(t *testing.T) {
	for _, s := range []string{"", "g", "g/1", "/1/2", "g/x/2", "g/1/-2", "g/1/2/3", "g/18446744073709551616/1"} {
		if _, err := ParseFence(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseFence(%q) err = %v, want ErrInvalid", s, err)
		}
	}
}

func TestFenceOrdering(t *testing.T) {
	tests := []struct {
		name  string
		a, b  Fence
		cmp   int
		ok    bool
		newer bool
	}{
		{"higher epoch wins over higher seq", Fence{"g", 2, 1}, Fence{"g", 1, 99}, 1, true, true},
		{"same epoch, higher seq", Fence{"g", 1, 5}, Fence{"g", 1, 4}, 1, true, true},
		{"older", Fence{"g", 1, 4}, Fence{"g", 1, 5}, -1, true, false},
		{"equal", Fence{"g", 3, 3}, Fence{"g", 3, 3}, 0, true, false},
		{"different grants are not ordered", Fence{"a", 9, 9}, Fence{"b", 1, 1}, 0, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmp, ok := tt.a.Compare(tt.b)
			if cmp != tt.cmp || ok != tt.ok {
				t.Fatalf("Compare = %d, %v; want %d, %v", cmp, ok, tt.cmp, tt.ok)
			}
			if got := tt.a.Supersedes(tt.b); got != tt.newer {
				t.Fatalf("Supersedes = %v, want %v", got, tt.newer)
			}
		})
	}
}

func FuzzParseFence(f *testing.F) {
	for _, s := range []string{"g/1/2", "", "a/b/c", "x/0/0", "//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fe, err := ParseFence(s)
		if err != nil {
			return
		}
		back, err := ParseFence(fe.String())
		if err != nil || back != fe {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", s, fe, fe.String(), back, err)
		}
	})
}

package main

import (
	"testing"

	"fiberd.io/fiberd/pkg/backend"
)

func TestParseIDRange(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want idRange
		ok   bool
	}{
		{"", idRange{}, true},
		{"32768-49151", idRange{32768, 16384}, true},
		{"100000-100000", idRange{100000, 1}, true},
		{"0-10", idRange{}, false},
		{"10-9", idRange{}, false},
		{"10", idRange{}, false},
		{"1-4294967295", idRange{}, false},
		{"a-b", idRange{}, false},
	} {
		got, err := parseIDRange(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseIDRange(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestDefaultIDs(t *testing.T) {
	m := func(text string) []idExtent {
		t.Helper()
		e, err := parseIDMap(text)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	host := m("         0          0 4294967295\n")
	pod := m("         0 2129199104      65536\n")
	def := idRange{backend.DefaultIDFirst, backend.DefaultIDCount}
	for _, tc := range []struct {
		name       string
		uids, gids []idExtent
		own        []uint32
		want       idRange
		ok         bool
	}{
		{"the host keeps the default pool", host, host, []uint32{0, 0}, def, true},
		{"a Pod's user namespace", pod, pod, []uint32{65532, 65532}, idRange{32768, 16384}, true},
		{"root of a Pod's user namespace", pod, pod, []uint32{0, 0}, idRange{32768, 16384}, true},
		{"the widest range both maps hold", m("0 1000 10\n100 5000 1000\n"), m("0 1000 500\n"), nil, idRange{300, 100}, true},
		{"a namespace holding the default pool", m("1879048192 1 65536\n"), m("1879048192 1 65536\n"), nil, def, true},
		{"one id mapped", m("65532 1000 1\n"), m("65532 1000 1\n"), nil, idRange{}, false},
		{"fiberd's own id in the pool", pod, pod, []uint32{40000}, idRange{}, false},
		{"no map", nil, nil, nil, idRange{}, false},
	} {
		got, err := defaultIDs(tc.uids, tc.gids, tc.own...)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%s: defaultIDs = %v, %v; want %v, ok %v", tc.name, got, err, tc.want, tc.ok)
		}
	}
	if _, err := parseIDMap("0 1\n"); err == nil {
		t.Error("parseIDMap took a line of two numbers")
	}
}

package endpoint

import (
	"errors"
	"strings"
	"testing"

	"fiberd.io/fiberd/pkg/core"
)

func TestParse(t *testing.T) {
	long := "/" + strings.Repeat("a", MaxUnixPath-1)
	tests := []struct {
		url      string
		network  string
		address  string
		wantFail bool
	}{
		{url: "unix:///run/fiberd/f-1-2.sock", network: "unix", address: "/run/fiberd/f-1-2.sock"},
		{url: "unix://" + long, network: "unix", address: long},
		{url: "unix://" + long + "a", wantFail: true},
		{url: "unix://run/x.sock", wantFail: true},
		{url: "unix://", wantFail: true},
		{url: "unix:///a\x00b", wantFail: true},
		{url: "tcp://127.0.0.1:8080", network: "tcp", address: "127.0.0.1:8080"},
		{url: "tcp://[::1]:8080", network: "tcp", address: "[::1]:8080"},
		{url: "tcp://[fe80::1%eth0]:1", network: "tcp", address: "[fe80::1%eth0]:1"},
		{url: "tcp://fiber.example.com:65535", network: "tcp", address: "fiber.example.com:65535"},
		{url: "tcp://localhost.:80", network: "tcp", address: "localhost.:80"},
		{url: "tcp://127.0.0.1", wantFail: true},
		{url: "tcp://127.0.0.1:", wantFail: true},
		{url: "tcp://127.0.0.1:0", wantFail: true},
		{url: "tcp://127.0.0.1:65536", wantFail: true},
		{url: "tcp://127.0.0.1:+80", wantFail: true},
		{url: "tcp://127.0.0.1:080", wantFail: true},
		{url: "tcp://127.0.0.1:http", wantFail: true},
		{url: "tcp://:8080", wantFail: true},
		{url: "tcp://::1:8080", wantFail: true},
		{url: "tcp://[127.0.0.1]:8080", wantFail: true},
		{url: "tcp://[example.com]:8080", wantFail: true},
		{url: "tcp://999.1.1.1:80", wantFail: true},
		{url: "tcp://-bad.example:80", wantFail: true},
		{url: "tcp://bad_host:80", wantFail: true},
		{url: "tcp://user@host:80", wantFail: true},
		{url: "tcp://host:80/path", wantFail: true},
		{url: "tcp://host:80?q", wantFail: true},
		{url: "tcp://host:80#f", wantFail: true},
		{url: "http://host:80", wantFail: true},
		{url: "TCP://host:80", wantFail: true},
		{url: "host:80", wantFail: true},
		{url: "", wantFail: true},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			network, address, err := Parse(tt.url)
			if tt.wantFail {
				if err == nil {
					t.Fatalf("Parse(%q) = %q, %q; want an error", tt.url, network, address)
				}
				if !errors.Is(err, core.ErrInvalid) {
					t.Errorf("Parse(%q) error %v does not wrap core.ErrInvalid", tt.url, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.url, err)
			}
			if network != tt.network || address != tt.address {
				t.Errorf("Parse(%q) = %q, %q; want %q, %q", tt.url, network, address, tt.network, tt.address)
			}
		})
	}
}

func TestURLRoundTrip(t *testing.T) {
	tests := []struct {
		url     string
		network string
		address string
	}{
		{UnixURL("/run/fiberd/a.sock"), "unix", "/run/fiberd/a.sock"},
		{TCPURL("10.0.0.7", 20001), "tcp", "10.0.0.7:20001"},
		{TCPURL("fd00::7", 20001), "tcp", "[fd00::7]:20001"},
	}
	for _, tt := range tests {
		network, address, err := Parse(tt.url)
		if err != nil || network != tt.network || address != tt.address {
			t.Errorf("Parse(%q) = %q, %q, %v; want %q, %q", tt.url, network, address, err, tt.network, tt.address)
		}
	}
	if got, want := TCPURL("::1", 8080), "tcp://[::1]:8080"; got != want {
		t.Errorf("TCPURL = %q, want %q", got, want)
	}
}

// FuzzParse checks that Parse never panics and that whatever it accepts is
// exactly the URL UnixURL or TCPURL builds from its result, so a client and
// fiberd agree on every endpoint.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"unix:///run/fiberd/x.sock", "unix://rel", "tcp://127.0.0.1:8080", "tcp://[::1]:8080",
		"tcp://[fe80::1%eth0]:9", "tcp://host.example:1", "tcp://::1:80", "tcp://h:0", "tcp://h:099",
		"tcp://[1.2.3.4]:5", "tcp://a@b:1", "tcp://", "unix://", "://", "tcp://1.2.3:4",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, url string) {
		network, address, err := Parse(url)
		if err != nil {
			if !errors.Is(err, core.ErrInvalid) {
				t.Fatalf("Parse(%q) error %v does not wrap core.ErrInvalid", url, err)
			}
			return
		}
		switch network {
		case "unix":
			if UnixURL(address) != url {
				t.Fatalf("Parse(%q) = unix %q, which builds %q", url, address, UnixURL(address))
			}
		case "tcp":
			if "tcp://"+address != url {
				t.Fatalf("Parse(%q) = tcp %q, not the URL's host:port", url, address)
			}
			n2, a2, err := Parse("tcp://" + address)
			if err != nil || n2 != network || a2 != address {
				t.Fatalf("reparse of %q = %q, %q, %v", url, n2, a2, err)
			}
		default:
			t.Fatalf("Parse(%q) network %q", url, network)
		}
	})
}

func TestIsLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "127.0.0.1": true, "127.1.2.3": true, "::1": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.7": false, "fd00::7": false,
		"example.com": false, "localhost.example.com": false, "[::1]": false,
	} {
		if got := IsLoopbackHost(host); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

package core

import (
	"errors"
	"slices"
	"testing"
)

func TestDeviceChannelFit(t *testing.T) {
	static := DeviceChannel{Kind: DeviceKindStatic, Devices: []string{"/dev/a", "/dev/b"}}
	dra := DeviceChannel{Kind: DeviceKindDRA, Claims: []string{"gpu"}}
	cases := []struct {
		name string
		c    DeviceChannel
		req  DeviceRequest
		want []string
		miss bool
	}{
		{"no request gets the channel whole", static, DeviceRequest{}, []string{"/dev/a", "/dev/b"}, false},
		{"a request gets its count", static, DeviceRequest{Class: "gpu", Count: 1}, []string{"/dev/a"}, false},
		{"all of them", static, DeviceRequest{Class: "gpu", Count: 2}, []string{"/dev/a", "/dev/b"}, false},
		{"more than offered", static, DeviceRequest{Class: "gpu", Count: 3}, nil, true},
		{"no channel", DeviceChannel{}, DeviceRequest{Class: "gpu", Count: 1}, nil, true},
		{"a DRA claim", dra, DeviceRequest{Class: "gpu", Count: 4}, nil, false},
	}
	for _, tc := range cases {
		got, err := tc.c.Fit(tc.req)
		if tc.miss {
			if !errors.Is(err, ErrNoCapacity) {
				t.Errorf("%s: %v, want ErrNoCapacity", tc.name, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got.Devices, tc.want) || got.Kind != tc.c.Kind || !slices.Equal(got.Claims, tc.c.Claims) {
			t.Errorf("%s: %+v, %v; want devices %v", tc.name, got, err, tc.want)
		}
	}
	out, _ := static.Fit(DeviceRequest{Count: 1})
	out.Devices[0] = "changed"
	if static.Devices[0] != "/dev/a" {
		t.Error("Fit shares the channel's slice")
	}
}

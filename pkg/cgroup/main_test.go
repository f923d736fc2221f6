package cgroup

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// enterEnv makes the test binary act as a child that enters the cgroup open
// as its descriptor 3 (see TestEnterFD) and prints its /proc/self/cgroup.
const enterEnv = "FIBERD_CGROUP_TEST_ENTER"

func TestMain(m *testing.M) {
	if os.Getenv(enterEnv) == "1" {
		if err := EnterFD(3); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		b, err := os.ReadFile("/proc/self/cgroup")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

//go:build integration

package main

import (
	"os"
	"testing"

	"fiberd.io/fiberd/test/kubeapi"
)

// TestMain starts no control plane itself: the first test that needs one
// does (kubeapi.NewEnv), and kubeapi.Main stops it after the last.
func TestMain(m *testing.M) { os.Exit(kubeapi.Main(m)) }

//go:build !integration

package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the unit tests leave no goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

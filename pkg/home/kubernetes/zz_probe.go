package kubernetes

import (
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/metadata"
	_ "k8s.io/apimachinery/pkg/util/strategicpatch"
	_ "k8s.io/utils/clock/testing"
	_ "go.uber.org/goleak"
	_ "k8s.io/klog/v2"
)

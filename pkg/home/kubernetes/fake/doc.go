// Package fake serves the Kubernetes home's slice of the API from memory,
// for tests that need no API server.
//
// A Kube holds Pods, Namespaces and ResourceClaim metadata, keyed by
// namespace and name, and serves them through the kubernetes.Kube
// interface. Tests set the world with SetPod, SetNamespace and
// SetResourceClaim, change it with the Delete methods, read what the home
// wrote with Pod, count calls with Calls, and make a method fail or block
// with Fail and Intercept.
//
// What it cannot do: it has no watches, no resourceVersion conflicts, no
// admission, defaulting or validation, no finalizers or graceful deletion
// (Delete removes at once; set a deletionTimestamp with SetPod to model a
// terminating object), and no RBAC. PatchPodStatus understands strategic
// merge patches only and, like the status subresource, keeps only the
// patched status. ResourceClaims are metadata alone, at no particular API
// version: a version that stops being served, and the rediscovery NewKube's
// Kube does then, are not modelled (SetNoResourceClaims is the cluster
// serving none), so those are tested against NewKube, with an httptest API
// server and with the real one.
//
// Only tests import it; it imports pkg/home/kubernetes for the Kube
// interface and ErrNoResourceClaims.
package fake

// Package v1alpha1 is the fiberd.io/v1alpha1 API of the fiberd controller: the FiberPool kind, a
// namespaced pool of grant Pods of one template.
//
// The types are written by hand with kubebuilder markers; `make generate` (controller-gen, pinned
// as a tool of this module) writes their DeepCopy methods (zz_generated.deepcopy.go) and the
// CustomResourceDefinition in deploy/controller, and TestGenerated fails when either is stale.
//
// Who imports it: the controller (package pool), its command, and clients that read or write
// pools. It imports the Kubernetes API types and controller-runtime's scheme builder, nothing of
// fiberd.
//
// +kubebuilder:object:generate=true
// +groupName=fiberd.io
package v1alpha1

package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// GroupVersion is fiberd.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "fiberd.io", Version: "v1alpha1"}

// schemeBuilder registers the kinds of this package with a scheme.
var schemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

// AddToScheme adds FiberPool and FiberPoolList to a scheme. Callers build their own scheme with
// it (there is no package-level one to mutate).
var AddToScheme = schemeBuilder.AddToScheme

func init() {
	schemeBuilder.Register(&FiberPool{}, &FiberPoolList{})
}

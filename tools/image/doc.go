// Package image builds container images from files without a registry or a
// container engine: one layer, every entry owned by root (unless a Dir says
// otherwise) and dated at the Unix epoch, sorted by path, so the same inputs
// give the same image digest on every machine. The result is a tarball in
// docker save's layout, which `ctr -n k8s.io images import` reads.
//
// fiberd's node images are built this way (hack/images.sh through
// cmd/mkimage): the sandbox image a node's containerd names, and the fiberd
// image, static binaries on the base layout (BaseDirs, BaseFiles). It is
// part of the tools module (fiberd.io/fiberd/tools), never of the product's
// go.mod; only commands of this module import it.
package image

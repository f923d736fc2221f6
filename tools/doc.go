// Module fiberd.io/fiberd/tools holds the programs fiberd's development
// and CI need that the product must not depend on: its dependencies (such
// as go-containerregistry) stay out of the product's go.mod. The root
// module's `go test ./...` and `go vet ./...` do not descend here, since
// this directory is a module of its own; `make test` and `make vet` run
// this module's tests and vet it.
//
//   - cmd/mkimage: files and static binaries to an image tarball
//     (package image), for hack/images.sh.
//   - cmd/pause: the sandbox process of a node's Pods.
//   - cmd/activate: binds a listening socket and execs a program with it
//     as descriptor 3 (socket activation), so a template runs as a plain
//     container.
//
// Add a command as cmd/<name>, its dependencies to this go.mod.
package tools

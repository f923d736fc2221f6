// Package cgroup is fiberd's cgroup v2 support: it finds the cgroup2 mount
// and this process's own cgroup, delegates a subtree to fiberd, carves one
// cgroup per grant and one leaf per fiber under it, and kills, freezes,
// waits for and removes those cgroups. It also reads pressure (PSI) for a
// leaf.
//
// # Layout
//
// Under the home's CgroupRoot (the "grants" directory when fiberd delegated
// its own cgroup) the tree is
//
//	<root>/<grantUID>/zygote           the grant's zygote (proc backend)
//	<root>/<grantUID>/f-<epoch>-<seq>  one leaf per fiber
//
// A delegated cgroup looks like
//
//	<delegated>/fiberd   fiberd itself and every process that was in <delegated>
//	<delegated>/grants   the root handed to Tree
//
// because cgroup v2 allows processes only in leaves once a cgroup enables
// controllers for its children (the "no internal processes" rule).
//
// # Who imports it
//
// pkg/backend creates grant cgroups and fiber leaves through Tree and moves
// processes into them: a forked child enters with EnterFD on the descriptor
// from Leaf.Open, an exec'd child with CLONE_INTO_CGROUP on the same
// descriptor. pkg/home/kubernetes calls Self and Delegate to find and carve
// the Pod's cgroup. Nothing here imports the rest of fiberd.
//
// # Degrading
//
// Controllers the machine does not offer (this machine has no memory
// controller, for example) and pressure files that are absent are logged
// once per Tree and skipped; they are never an error. On systems other than
// Linux every operation that touches the kernel returns an error wrapping
// errors.ErrUnsupported; the parsers work everywhere.
package cgroup

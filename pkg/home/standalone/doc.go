// Package standalone is fiberd's home on a plain host, the embedded default:
// a directory of grant files, a local or remote issuer, and a cgroup
// subtree of the host.
//
// What the home answers, against the home.Home seam:
//
//   - Grants: the *.jwt files of Config.GrantsDir, through the shared file
//     lane (home.FileLane). Without a directory the lane is nil: grants
//     arrive only inside Clone requests.
//   - Health: successful refreshes of the issuer's keys (grant.Cache's
//     Refresh), which Run drives every RefreshInterval. Without a cache
//     (keys verified offline from -issuer-keys, or none) the home is always
//     healthy.
//   - CgroupRoot: Config.CgroupRoot, or by default a delegated "fiberd"
//     subtree of this process's own cgroup (pkg/cgroup's Delegate). When
//     cgroup v2 is absent or not writable the home logs it once and runs
//     without cgroups (CgroupRoot is "").
//   - Devices: the static Config.Devices, handed to every grant, or none.
//   - PublishReady: recorded, and read back by Ready and the agent's status.
//   - Scope: none. OwnGrant: none; the home fetches no grant of its own.
//
// cmd/fiberd imports this package for -home standalone (and -dev). It
// imports pkg/home, pkg/core, pkg/grant and pkg/cgroup, never pkg/fiberd: it
// satisfies the agent's optional IssuerOverrider structurally.
package standalone

// Package procrec keeps records of the processes and cgroups a fiberd run
// started, as files in its state directory, so that the next run can end
// what a crash of fiberd (kill -9, an OOM kill, a power cut of the process
// but not of the machine) left behind before it serves.
//
// A process record is an empty file named "p-<pid>-<start>", start being
// the process's start time in clock ticks after boot (field 22 of
// /proc/<pid>/stat): a pid can be reused, a pid and a start time cannot. It
// is created once the process exists and removed once it has been reaped;
// creating one costs one open and close, and no sync: a record only has to
// outlive fiberd, not the machine, whose reboot ends every process anyway.
// A restore record, "r-<pid>-<after>", stands for a process a restore
// (CRIU, parking fibers) is bringing back at a pid it chose before, with a
// start time not known yet: it names whatever leads its own session at pid
// having started at or after tick after, and lives only as long as the
// restore. A cgroup record, "c-<name>", holds the absolute path of a cgroup
// directory the run carved; it is written once per grant (a temporary
// file, synced and renamed).
//
// Sweep ends what the records name, then removes them: each recorded cgroup
// that lies strictly under the cgroup root its caller names (the agent's)
// is killed whole (cgroup.kill), waited empty and removed (one elsewhere is
// left alone, its record kept); each recorded process that is still the
// same process (its pid and its start time) is killed, and so is every
// process of its session (every zygote and fiber leads its own session, so
// what a fiber started is found there, where no cgroup holds it). Sweep
// waits until they are gone. What it cannot see: a process that left its
// session (setsid) outside a cgroup, and, in the window between two runs,
// the members of a session whose leader died and whose pid was reused by
// another session leader that died too (the kernel never reuses a pid that
// still names a live session, so only this double reuse can mislead it).
//
// The backends (pkg/backend) record the processes they start when a warm
// request carries a Dir; the agent (pkg/fiberd) records its grants'
// cgroups, and sweeps at start, before it serves. procrec imports
// pkg/cgroup and the standard library.
package procrec

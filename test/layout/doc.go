// Package layout holds tests of the repository's shape: every package has a
// package doc comment, and imports point the way the architecture says
// (cmd -> fiberd -> home/*, backend, grant -> core). It has no code of its
// own; nothing imports it.
package layout

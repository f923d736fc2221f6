// Package docs is docs-check: it runs the commands of README.md and docs/*.md
// so that none of them can rot, and checks that the reference pages name
// everything the code has.
//
// # What a document's code blocks mean
//
// A fenced code block is run or checked by its info string:
//
//   - ```sh (or bash, shell): run. The blocks of one document run in order,
//     in one bash process started in the root of a copy of the checkout
//     (the files git tracks or would track), with `set -eEuo pipefail`, so
//     a variable set in one block is there in the next and nothing a
//     document writes reaches the real tree. A command that fails fails the
//     check, which names the document, the line and the output of the
//     block; a document still running after two minutes fails too.
//   - ```sh cluster: needs a Kubernetes cluster. Checked only: `bash -n`
//     must accept it and every repository path it names must exist. The
//     e2e suite (test/e2e) applies the manifests of deploy/kubernetes to a
//     real API server and runs fiberd against it.
//   - ```sh bench: a measurement that takes minutes and rewrites the
//     published results (docs/benchmarks.md). Checked like a cluster block.
//   - ```sh long: a command that does not return (a daemon in the
//     foreground) or that runs these checks itself (make ci), such as the
//     README's first two commands. Checked like a cluster block; the
//     daemon is what TestDocs starts for every document, and test/process
//     runs it as a process.
//   - ```LANG file=PATH: written to PATH, relative to the working directory
//     the document's shell is in when the block is reached, so the source a
//     document shows is the source its next commands build.
//   - ```text logs: each line is a log line fiberd prints; the quoted
//     message of each must be a string literal of the Go code under pkg/ or
//     cmd/.
//   - anything else (text, console, json, yaml, go, ...): illustrative.
//
// # The environment of a document
//
// TestDocs builds fiberd and fiberctl into a temporary bin directory put
// first on PATH, starts `fiberd -dev` with a state directory of its own
// (-state under a temporary directory, -listen 127.0.0.1:0), and runs each
// document with FIBERD_ADDR=unix://<state>/fiberd.sock and TMPDIR inside the
// temporary directory, so `mktemp -d` in a document leaves nothing behind.
// Whatever a document started is killed (its process group) when it ends.
// A document names in prose what the check provides, the way a reader gets
// it: `fiberd -dev` in another terminal and FIBERD_ADDR exported.
//
// # Reference checks
//
// Besides running the blocks: every flag `fiberd -h` prints must have a row
// in the flags table of docs/operations.md, and every row there must be a
// flag (or say "testhooks"); every route pkg/fiberd registers must be named
// in docs/api.md; every fiberd_* metric the running fiberd serves must be
// named in docs/api.md and docs/operations.md; every relative link of a
// document must resolve.
//
// `make docs-check` runs this package. It needs go, bash, curl, cc and
// python3, and skips naming what is missing. It imports nothing of fiberd:
// it drives the binaries, as a reader does.
package docs

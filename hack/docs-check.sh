#!/usr/bin/env bash
# docs-check.sh: run every command of README.md and docs/*.md, so none can
# rot. The check is the Go test package test/docs (read its doc.go for what
# each kind of code block means): it builds fiberd and fiberctl into a
# temporary directory, starts `fiberd -dev` with a state directory of its
# own, runs each document's sh blocks in order in one bash process, and
# checks that the flags, routes and metrics of the code are documented.
#
#   hack/docs-check.sh                 # or: make docs-check
#   hack/docs-check.sh -run 'TestDocs/docs_api'   # one document
#   DOCS_CHECK_KEEP=1 hack/docs-check.sh -v       # keep each script and its output
#
# Needs: go, bash, curl, jq, cc, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go test -count=1 -timeout 20m ./test/docs/ "$@"

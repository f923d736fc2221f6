// Package template reads the template specs a node offers and checks a
// grant's template reference against them.
//
// A template is what a grant runs. The node keeps one JSON spec per template
// in a directory (fiberd's -templates flag), the file <name>.json:
//
//	{
//	  "command": "/usr/bin/python3",
//	  "args": ["/opt/counter.py", "--init-ms", "200"],
//	  "env": {"PYTHONUNBUFFERED": "1"},
//	  "workdir": "/opt",
//	  "zygote": true
//	}
//
// A grant names its template as "name@sha256:<hex>", where hex is the
// SHA-256 of the spec file's bytes exactly as they lie on disk. The grant is
// refused when the file is missing or its digest differs; the error names
// both digests, so an operator sees which side is out of date.
//
// "zygote": true says the command speaks the zygote protocol (sdk/zygote)
// and may be served at tier WARM by the proc backend; every template can be
// served at tier BASIC by the exec backend.
//
// "isolation": "shared" lets the fibers of one grant share the grant's
// namespaces where the node isolates grants (by default each fiber gets a
// PID namespace and a /tmp of its own), and "network": "none" gives the
// grant a network namespace with loopback only (see pkg/backend).
//
// # Who imports it
//
// pkg/backend takes a Spec; pkg/fiberd resolves a grant's reference with
// Dir.Resolve when it admits the grant. template imports only pkg/core.
package template

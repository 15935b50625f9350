//go:build tools

// Module prombin builds a real Prometheus from the Go module proxy for the
// alert gate's test against the real thing (make test-prometheus; see
// hack/prombin.sh). It is a separate module so that Prometheus' dependency
// graph never enters the agent's.
package prombin

import _ "github.com/prometheus/prometheus/cmd/prometheus"

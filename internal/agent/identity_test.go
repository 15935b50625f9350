package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

func TestIdentity(t *testing.T) {
	const node, path = "node-a", "/var/lib/lifecycle-agent/journal.db"
	a := Identity(node, path, "0123456789abcdef0123456789abcdef")
	if a != Identity(node, path, "0123456789abcdef0123456789abcdef") {
		t.Fatal("Identity is not stable for the same node, journal and machine")
	}
	for _, other := range []string{
		Identity(node, path, "fedcba9876543210fedcba9876543210"), // another machine, same name and path
		Identity(node, "/srv/journal.db", "0123456789abcdef0123456789abcdef"),
		Identity("node-b", path, "0123456789abcdef0123456789abcdef"),
		LegacyIdentity(node, path),
	} {
		if other == a {
			t.Errorf("%s is the identity of a different agent too", a)
		}
	}
	// The form older agents used: node/<8 hex of sha256(journal path)>.
	if got, want := LegacyIdentity(node, path), "node-a/"+sha8(path); got != want {
		t.Errorf("LegacyIdentity = %s, want %s", got, want)
	}
	if Identity(node, path, "") != LegacyIdentity(node, path) {
		t.Error("without a machine ID the identity must stay the old one")
	}
}

func sha8(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:8]
}

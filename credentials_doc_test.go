package flashgate_test

import (
	"os"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/roles"
)

// TestCredentialsNameTheGatewaysNATSPermissions: every subject the roles let
// a gateway publish or subscribe to on NATS (roles.NATSUsers) is named in
// docs/credentials.md's gateway entry, so that someone writing the
// permissions of another deployment from the page gives a gateway all it
// needs (its lane requests, its live-view counts).
func TestCredentialsNameTheGatewaysNATSPermissions(t *testing.T) {
	doc, err := os.ReadFile("docs/credentials.md")
	if err != nil {
		t.Fatal(err)
	}
	_, entry, _ := strings.Cut(string(doc), "- gateway may publish")
	entry, _, _ = strings.Cut(entry, "\n- backend ")
	if entry == "" {
		t.Fatal("docs/credentials.md: no \"- gateway may publish\" entry")
	}
	n := 0
	for _, u := range roles.NATSUsers(config.Default()) {
		if u.Name != roles.Gateway {
			continue
		}
		for _, s := range append(append([]string{}, u.Publish...), u.Subscribe...) {
			s = strings.TrimSuffix(strings.TrimSuffix(s, ".*"), ".>")
			n++
			if !strings.Contains(entry, "`"+s) {
				t.Errorf("the gateway may use NATS subject %s (roles.NATSUsers) but docs/credentials.md's gateway entry does not name it", s)
			}
		}
	}
	if n < 5 {
		t.Fatalf("read only %d of the gateway's subjects from package roles", n)
	}
}

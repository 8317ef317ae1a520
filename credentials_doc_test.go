package flashgate_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestCredentialsNameTheGatewaysNATSPermissions: every subject the stack's
// NATS lets a gateway publish or subscribe to (scripts/stack.sh,
// write_nats_conf) is named in docs/credentials.md's gateway entry, so that
// someone writing the permissions of another deployment from the page gives
// a gateway all it needs (its lane requests, its live-view counts).
func TestCredentialsNameTheGatewaysNATSPermissions(t *testing.T) {
	stack, err := os.ReadFile("scripts/stack.sh")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^(NATS_[A-Z]+)=([A-Za-z0-9_.]+)$`).FindAllStringSubmatch(string(stack), -1) {
		vars[m[1]] = m[2]
	}
	block := regexp.MustCompile(`(?s)user: "\$U_GATEWAY".*?publish: \{ allow: \[(.*?)\] \}.*?subscribe: \{ allow: \[(.*?)\] \}`).FindStringSubmatch(string(stack))
	if block == nil || len(vars) < 4 {
		t.Fatalf("scripts/stack.sh: the gateway's NATS permissions or the subject variables not found (%v)", vars)
	}
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
	for _, list := range block[1:3] {
		for _, m := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(list, -1) {
			s := strings.ReplaceAll(m[1], `\$`, "$")
			s = regexp.MustCompile(`\$\{?(NATS_[A-Z]+)\}?|\$s\b`).ReplaceAllStringFunc(s, func(v string) string {
				if v == "$s" {
					return vars["NATS_STREAM"]
				}
				return vars[strings.Trim(v, "${}")]
			})
			s = strings.TrimSuffix(strings.TrimSuffix(s, ".*"), ".>")
			n++
			if !strings.Contains(entry, "`"+s) {
				t.Errorf("the gateway may use NATS subject %s (scripts/stack.sh) but docs/credentials.md's gateway entry does not name it", m[1])
			}
		}
	}
	if n < 5 {
		t.Fatalf("read only %d of the gateway's subjects from scripts/stack.sh", n)
	}
}

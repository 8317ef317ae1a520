package flashgate_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// alerts are the alerting rules of deploy/prometheus/ that docs/runbook.md
// answers; a rule file there may add more, and each must have its section too.
var alerts = []string{
	"FlashgateGatewayDown", "FlashgateBackendDown", "FlashgateNoLeader", "FlashgateConservationError",
	"FlashgateOrdersPending", "FlashgateDeadLetters", "FlashgateHighRefusalRate5xx",
	"FlashgateBreakerOpen", "FlashgateAdmissionLatencyHigh", "FlashgateClockSkew", "FlashgateOrderEventsBacklog",
}

// TestRunbookCoversEveryAlert: docs/runbook.md has a "## <alert>" section
// (the anchor each rule's runbook_url names) saying what the alert means and
// what to do, for every alert here and in deploy/prometheus/.
func TestRunbookCoversEveryAlert(t *testing.T) {
	b, err := os.ReadFile("docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	for _, s := range strings.Split(string(b), "\n## ")[1:] {
		name, body, _ := strings.Cut(s, "\n")
		sections[strings.TrimSpace(name)] = body
	}
	names := append([]string(nil), alerts...)
	files, _ := filepath.Glob("deploy/prometheus/*.yml")
	rule := regexp.MustCompile(`(?m)^\s*-?\s*alert:\s*(\S+)`)
	for _, f := range files {
		y, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range rule.FindAllStringSubmatch(string(y), -1) {
			names = append(names, m[1])
		}
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			continue
		}
		seen[n] = true
		body, ok := sections[n]
		switch {
		case !ok:
			t.Errorf("docs/runbook.md has no section ## %s", n)
		case !strings.Contains(body, "**Meaning.**") || !strings.Contains(body, "**Do.**"):
			t.Errorf("docs/runbook.md ## %s does not say what it means and what to do", n)
		}
	}
	t.Logf("%d alerts (%d rule files) each have a runbook section", len(seen), len(files))
}

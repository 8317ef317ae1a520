package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/flashgate/flashgate/adminapi"
)

const denyUsage = `usage: flashgate deny <add|remove|list> ...

  deny add --user U | --jti J [--for 24h | --until RFC3339]
                    revoke a buyer (every token of the subject) or one token; every gateway refuses
                    it within a second, cached or not (operator; default: auth.max_token_ttl + 1m)
  deny remove --user U | --jti J
                    lift an entry (operator)
  deny list [--json]
                    the entries in force and when each lapses
`

func denyCmd(args []string, stdout, stderr io.Writer) error {
	return dispatch("deny", denyUsage, map[string]subcommand{"add": denyAddCmd, "remove": denyRemoveCmd, "list": denyListCmd}, args, stdout, stderr)
}

// denyTarget reads --user and --jti: exactly one.
func denyTarget(c *command, user, jti string) (kind, id string, err error) {
	switch {
	case (user == "") == (jti == ""):
		return "", "", c.usageError("give --user or --jti, one of them")
	case user != "":
		return "sub", user, nil
	}
	return "jti", jti, nil
}

func denyAddCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("deny add", "--user U | --jti J [--for D | --until T]", stderr)
	user := c.String("user", "", "revoke every token of this `subject`")
	jti := c.String("jti", "", "revoke the one token with this `id` (its jti claim)")
	dur := c.Duration("for", 0, "how long the entry lasts (default auth.max_token_ttl + 1m)")
	until := c.String("until", "", "when the entry lapses (RFC 3339), instead of --for")
	if pos, err := c.parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return c.usageError("unexpected %q", pos[0])
	}
	kind, id, err := denyTarget(c, *user, *jti)
	if err != nil {
		return err
	}
	body := map[string]any{"kind": kind, "id": id}
	switch {
	case *dur != 0 && *until != "":
		return c.usageError("give --for or --until, not both")
	case *dur != 0:
		body["for"] = dur.String()
	case *until != "":
		t, err := time.Parse(time.RFC3339, *until)
		if err != nil {
			return c.usageError("--until %q is not RFC 3339", *until)
		}
		body["until"] = t
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	out, err := adminapi.New(cfg).Do(context.Background(), http.MethodPost, "/admin/v1/denylist", body)
	if err != nil {
		return err
	}
	writePretty(stdout, out)
	return nil
}

func denyRemoveCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("deny remove", "--user U | --jti J", stderr)
	user := c.String("user", "", "the `subject` to lift")
	jti := c.String("jti", "", "the token `id` to lift")
	if pos, err := c.parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return c.usageError("unexpected %q", pos[0])
	}
	kind, id, err := denyTarget(c, *user, *jti)
	if err != nil {
		return err
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	out, err := adminapi.New(cfg).Do(context.Background(), http.MethodDelete, "/admin/v1/denylist/"+kind+"/"+url.PathEscape(id), nil)
	if err != nil {
		return err
	}
	writePretty(stdout, out)
	return nil
}

func denyListCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("deny list", "[--json]", stderr)
	asJSON := c.Bool("json", false, "the API's JSON as it is")
	if pos, err := c.parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return c.usageError("unexpected %q", pos[0])
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	out, err := adminapi.New(cfg).Do(context.Background(), http.MethodGet, "/admin/v1/denylist", nil)
	if err != nil {
		return err
	}
	if *asJSON {
		writePretty(stdout, out)
		return nil
	}
	var page struct {
		Entries []struct {
			Kind  string    `json:"kind"`
			ID    string    `json:"id"`
			Until time.Time `json:"until"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(out, &page); err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tID\tUNTIL")
	for _, e := range page.Entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Kind, e.ID, e.Until.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

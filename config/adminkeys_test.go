package config

import (
	"reflect"
	"strings"
	"testing"
)

// admin.keys: ids and roles checked, admin.token the operator key "default".
func TestAdminKeys(t *testing.T) {
	tok := func(c string) string { return strings.Repeat(c, MinAdminTokenBytes) }
	c := Default()
	c.Admin.Token = tok("o")
	c.Admin.Keys = []AdminKey{{ID: "ann", Role: RoleViewer, Token: tok("v")}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	ks := c.Admin.AdminKeys()
	if len(ks) != 2 || ks[1] != (AdminKey{ID: DefaultAdminKeyID, Role: RoleOperator, Token: tok("o")}) || ks[0].Role != RoleViewer {
		t.Fatalf("keys %+v", ks)
	}
	for name, bad := range map[string][]AdminKey{
		"no id":       {{Role: RoleViewer, Token: tok("v")}},
		"default id":  {{ID: DefaultAdminKeyID, Role: RoleViewer, Token: tok("v")}},
		"bad role":    {{ID: "ann", Role: "admin", Token: tok("v")}},
		"no token":    {{ID: "ann", Role: RoleViewer}},
		"short token": {{ID: "ann", Role: RoleViewer, Token: "short"}},
		"same token":  {{ID: "ann", Role: RoleViewer, Token: tok("o")}},
	} {
		c.Admin.Keys = bad
		if err := c.Validate(); err == nil {
			t.Errorf("%s: %+v taken", name, bad)
		}
	}
	// From the environment, in YAML flow form like auth.keys.
	t.Setenv("FLASHGATE_ADMIN_KEYS", "[{id: ann, role: viewer, token: "+tok("v")+"}]")
	t.Setenv("FLASHGATE_ADMIN_TOKEN", tok("o"))
	got, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Admin.Keys) != 1 || got.Admin.Keys[0].ID != "ann" {
		t.Fatalf("from env: %+v", got.Admin.Keys)
	}
	// Environ hands them to a child process (the tests' spawned backends).
	env := map[string]string{}
	for _, kv := range Environ(got) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	back := Default()
	if err := applyEnv(&back, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Admin.Keys, got.Admin.Keys) {
		t.Fatalf("through Environ: %+v, want %+v", back.Admin.Keys, got.Admin.Keys)
	}
}

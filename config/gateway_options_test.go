package config

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// TestGatewayOptions: the gateway's options carry the values of the sections
// they come from, and every option is filled (a field added to
// GatewayOptions but not to Config.GatewayOptions would reach the gateway as
// its zero value).
func TestGatewayOptions(t *testing.T) {
	c := Default()
	c.Gateway.Listen = ":9123"
	c.NATS.OrderSubject = "x.orders"
	c.Auth.JWTSecret = "s"
	c.RateLimit.PerIP.Rate = 7
	c.Orders.PaymentTimeout = 3 * time.Minute
	c.Redis.WaitReplicas, c.Redis.WaitTimeout = 1, 50*time.Millisecond
	c.Sales.LiveGrace = 5 * time.Hour
	c.Admin.Token = "admin"
	c.Admin.AllowedHosts = []string{"admin.example:8081"}
	c.Payments.Secret = Secrets{"pay"}
	c.Source = "/etc/flashgate.yaml"
	o := c.GatewayOptions()
	want := GatewayOptions{Gateway: c.Gateway, NATS: c.NATS, Auth: c.Auth, RateLimit: c.RateLimit,
		PaymentTimeout: 3 * time.Minute, WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond, LiveGrace: 5 * time.Hour, AdminToken: "admin",
		AdminHosts: []string{"admin.example:8081"}, PaymentSecrets: Secrets{"pay"}, File: "/etc/flashgate.yaml"}
	if !reflect.DeepEqual(o, want) {
		t.Fatalf("GatewayOptions() = %+v\nwant %+v", o, want)
	}
	v := reflect.ValueOf(o)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("GatewayOptions.%s is not filled from the configuration", v.Type().Field(i).Name)
		}
	}
}

// TestLoadRateLimit: a reload reads the file's ratelimit block, validated as
// part of the whole file; a file that does not load is an error.
func TestLoadRateLimit(t *testing.T) {
	clearEnv(t)
	t.Setenv("FLASHGATE_JWT_SECRET", "from-env-0123456789abcdef0123456789")
	file := filepath.Join(t.TempDir(), "f.yaml")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ratelimit:\n  per_ip:\n    rate: 42\n    burst: 84\n")
	rl, err := LoadRateLimit(file)
	if err != nil || rl.PerIP.Rate != 42 || rl.PerIP.Burst != 84 || rl.PerUser != Default().RateLimit.PerUser {
		t.Fatalf("LoadRateLimit = %+v, %v", rl, err)
	}
	write("ratelimit:\n  per_ip:\n    rate: -1\n")
	if _, err := LoadRateLimit(file); err == nil {
		t.Fatal("LoadRateLimit of an invalid rate: no error")
	}
	write("gateway:\n  lisen: :9000\n")
	if _, err := LoadRateLimit(file); err == nil {
		t.Fatal("LoadRateLimit of a file with an unknown key: no error")
	}
}

// TestShadowed: a FLASHGATE_* variable that sets a key of the block is named
// with the key's YAML path; variables of other blocks are not.
func TestShadowed(t *testing.T) {
	env := map[string]string{
		"FLASHGATE_RATELIMIT_PER_IP_RATE": "7", "FLASHGATE_RATELIMIT_MAX_INFLIGHT": "3",
		"FLASHGATE_GATEWAY_LISTEN": ":1",
	}
	got := shadowed("ratelimit", func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	want := map[string]string{
		"ratelimit.per_ip.rate": "FLASHGATE_RATELIMIT_PER_IP_RATE", "ratelimit.max_inflight": "FLASHGATE_RATELIMIT_MAX_INFLIGHT",
	}
	if len(got) != len(want) {
		t.Fatalf("shadowed = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("shadowed[%s] = %q, want %q", k, got[k], v)
		}
	}
	if got := shadowed("admin", func(k string) (string, bool) { return "x", k == "FLASHGATE_ADMIN_TOKEN" }); got["admin.token"] != "FLASHGATE_ADMIN_TOKEN" {
		t.Errorf("admin.token by its short name: %v", got)
	}
}

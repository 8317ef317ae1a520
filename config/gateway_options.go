package config

import (
	"os"
	"reflect"
	"strings"
	"time"
)

// GatewayOptions is the part of the configuration a gateway runs with: its
// own section and the few values it takes from other sections. The gateway is
// handed this, never the whole Config, so what it depends on is visible here.
type GatewayOptions struct {
	Gateway Gateway
	// NATS names the stream and the subjects the gateway publishes orders,
	// sale events and order commands on (the connection is dialed elsewhere).
	NATS      NATS
	Auth      Auth
	RateLimit RateLimit
	// PaymentTimeout sets each admitted order's pay-by time.
	PaymentTimeout time.Duration
	// WaitReplicas and WaitTimeout: redis.wait_replicas and redis.wait_timeout,
	// how many replicas an admission waits for before the 202, and how long.
	WaitReplicas int
	WaitTimeout  time.Duration
	// LiveGrace is how long an ended sale stays in the gateway's cache.
	LiveGrace time.Duration
	// AdminToken guards the admin API and pprof on the admin port.
	AdminToken string
	// AdminHosts is admin.allowed_hosts: the Host headers the admin port
	// answers (empty: its listen address and localhost's).
	AdminHosts []string
	// PaymentSecrets verify the payment service's signatures (payments.secret).
	PaymentSecrets Secrets
	// File is the configuration file the rate limits are reloaded from
	// ("" when the configuration came from defaults and the environment).
	File string
}

// GatewayOptions picks the gateway's options out of the configuration.
func (c Config) GatewayOptions() GatewayOptions {
	return GatewayOptions{
		Gateway:        c.Gateway,
		NATS:           c.NATS,
		Auth:           c.Auth,
		RateLimit:      c.RateLimit,
		PaymentTimeout: c.Orders.PaymentTimeout,
		WaitReplicas:   c.Redis.WaitReplicas,
		WaitTimeout:    c.Redis.WaitTimeout,
		LiveGrace:      c.Sales.LiveGrace,
		AdminToken:     c.Admin.Token,
		AdminHosts:     c.Admin.AllowedHosts,
		PaymentSecrets: c.Payments.Secret,
		File:           c.Source,
	}
}

// LoadRateLimit loads the configuration file again, validated as a whole, and
// returns its ratelimit block: the one block a running gateway reloads.
func LoadRateLimit(file string) (RateLimit, error) {
	c, err := Load(file)
	if err != nil {
		return RateLimit{}, err
	}
	return c.RateLimit, nil
}

// Shadowed are the keys under prefix (a block such as "ratelimit") that a
// FLASHGATE_* variable of the environment sets: key → variable. A reload
// reads the file again, but the environment still wins for these keys, so the
// file's value of each is not used; the gateway logs them and shows them in
// GET /admin/v1/limits.
func Shadowed(prefix string) map[string]string {
	return shadowed(prefix, os.LookupEnv)
}

func shadowed(prefix string, lookup func(string) (string, bool)) map[string]string {
	out := map[string]string{}
	var visit func(t reflect.Type, key, env string)
	visit = func(t reflect.Type, key, env string) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := yamlName(f)
			if name == "-" {
				continue
			}
			k, e := name, "FLASHGATE_"+strings.ToUpper(name)
			if key != "" {
				k, e = key+"."+name, env+"_"+strings.ToUpper(name)
			}
			if f.Type.Kind() == reflect.Struct {
				visit(f.Type, k, e)
				continue
			}
			if k != prefix && !strings.HasPrefix(k, prefix+".") {
				continue
			}
			for _, n := range envNames(f, e) {
				if _, ok := lookup(n); ok {
					out[k] = n
				}
			}
			for n, path := range shortEnv {
				if _, ok := lookup(n); ok && path == k {
					out[k] = n
				}
			}
		}
	}
	visit(reflect.TypeOf(Config{}), "", "")
	return out
}

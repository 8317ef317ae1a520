package config

import (
	"strings"
	"testing"
	"time"
)

func TestSalesRetention(t *testing.T) {
	d := Default()
	if d.Sales.Retention != 168*time.Hour || d.Sales.LiveGrace != 24*time.Hour {
		t.Fatalf("defaults: retention %v, live_grace %v; want 168h, 24h", d.Sales.Retention, d.Sales.LiveGrace)
	}
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		err  string
	}{
		{"defaults", func(*Config) {}, ""},
		{"retention under an hour", func(c *Config) { c.Sales.Retention, c.Sales.LiveGrace = 30*time.Minute, 20*time.Minute },
			"sales.retention must be at least 1h"},
		{"grace under the payment timeout", func(c *Config) { c.Sales.LiveGrace = 10 * time.Minute },
			"sales.live_grace must be between"},
		{"grace over retention", func(c *Config) { c.Sales.LiveGrace = 200 * time.Hour },
			"sales.live_grace must be between"},
		{"a grace equal to both bounds", func(c *Config) {
			c.Sales.Retention, c.Sales.LiveGrace, c.Orders.PaymentTimeout = time.Hour, time.Hour, time.Hour
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mut(&c)
			err := c.Validate()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Validate: %v, want %q", err, tc.err)
			}
		})
	}
	t.Setenv("FLASHGATE_SALES_RETENTION", "48h")
	t.Setenv("FLASHGATE_SALES_LIVE_GRACE", "2h")
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if c.Sales.Retention != 48*time.Hour || c.Sales.LiveGrace != 2*time.Hour {
		t.Fatalf("from the environment: retention %v, live_grace %v", c.Sales.Retention, c.Sales.LiveGrace)
	}
}

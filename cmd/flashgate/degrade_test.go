package main

import (
	"bytes"
	"strings"
	"testing"
)

// sale create checks --degrade and --degrade-rate before it calls the admin API.
func TestSaleCreateDegradeFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--degrade", "redis"}, `degrade "redis": must be closed or mysql`},
		{[]string{"--degrade-rate", "5"}, "degrade_rate needs degrade: mysql"},
		{[]string{"--degrade", "mysql", "--degrade-rate", "5000"}, "degrade_rate must be between 1 and 1024"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"sale", "create", "--id", "s1", "--total", "10", "--config", ""}, c.args...)
		if err := run(args, &out, &errb); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

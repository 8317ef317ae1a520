package config

import "time"

// BackendOptions is the part of the configuration a backend runs with: its
// own section and the few values it takes from other sections. The backend is
// handed this, never the whole Config; its clients (MySQL, Redis, NATS, the
// leader lock) are dialed by the caller from the mysql, redis and nats blocks.
type BackendOptions struct {
	Backend Backend
	// NATS names the stream, the durable consumer and the subjects of orders,
	// dead letters, sale events and order commands.
	NATS NATS
	// AdminKeys guard the admin API and pprof: admin.keys, and admin.token
	// as the operator key "default".
	AdminKeys []AdminKey
	// Retention is sales.retention: how long after its end a settled sale
	// stays in Redis.
	Retention time.Duration
	// PublishTimeout is the gateways' gateway.publish_timeout: how long an
	// admission's publish may still be on its way when Redis lost the sale.
	PublishTimeout time.Duration
	// WaitReplicas and WaitTimeout: redis.wait_replicas and redis.wait_timeout,
	// which reconcile's landing of transfers between stock buckets waits for
	// as the gateways' transfers do (docs/buckets.md).
	WaitReplicas int
	WaitTimeout  time.Duration
	// Events is the events block: the order-events stream the leader
	// publishes the outbox to.
	Events Events
	// MaxTokenTTL is auth.max_token_ttl: how long a denylist entry lasts by
	// default (every token it names has expired by then). The backend
	// verifies no token and holds no signing key.
	MaxTokenTTL time.Duration
	// AllowedHosts is admin.allowed_hosts: the Host headers the admin port
	// answers (empty: its listen address and localhost's).
	AllowedHosts []string
	// PaymentTimeout is orders.payment_timeout: the writer sets every
	// order's pay-by time from it, whatever the message says.
	PaymentTimeout time.Duration
}

// BackendOptions picks the backend's options out of the configuration.
func (c Config) BackendOptions() BackendOptions {
	return BackendOptions{
		Backend:        c.Backend,
		NATS:           c.NATS,
		AdminKeys:      c.Admin.AdminKeys(),
		Retention:      c.Sales.Retention,
		PublishTimeout: c.Gateway.PublishTimeout,
		WaitReplicas:   c.Redis.WaitReplicas,
		WaitTimeout:    c.Redis.WaitTimeout,
		Events:         c.Events,
		MaxTokenTTL:    c.Auth.MaxTokenTTL,
		AllowedHosts:   c.Admin.AllowedHosts,
		PaymentTimeout: c.Orders.PaymentTimeout,
	}
}

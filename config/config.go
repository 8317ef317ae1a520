// Package config is flashgate's one configuration struct: defaults, then the YAML
// file (strict: an unknown key is an error), then environment overrides. Every key
// a.b_c can be set with FLASHGATE_A_B_C; a few have the shorter names of docs/design.md
// §3/§10 (FLASHGATE_JWT_SECRET, FLASHGATE_ADMIN_TOKEN, FLASHGATE_REDIS_ADDRS, ...).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/flashgate/flashgate"
)

// Config is everything the gateway, the backend and the CLI read.
type Config struct {
	Gateway   Gateway   `yaml:"gateway"`
	Backend   Backend   `yaml:"backend"`
	Auth      Auth      `yaml:"auth"`
	Admin     Admin     `yaml:"admin"`
	Redis     Redis     `yaml:"redis"`
	NATS      NATS      `yaml:"nats"`
	MySQL     MySQL     `yaml:"mysql"`
	Orders    Orders    `yaml:"orders"`
	Events    Events    `yaml:"events"`
	RateLimit RateLimit `yaml:"ratelimit"`
	Sales     Sales     `yaml:"sales"`
	Payments  Payments  `yaml:"payments"`

	// Dev accepts weak and published secrets (FLASHGATE_DEV=1): for the local
	// stack and tests only. The processes log a warning when it is on.
	Dev bool `yaml:"dev"`

	// Source is the file the configuration was loaded from ("" for none); the
	// gateway watches it to reload the rate limits.
	Source string `yaml:"-"`
}

// Gateway is the edge process.
type Gateway struct {
	// Listen is the public API's address (docs/design.md §3); behind nginx, a loopback address.
	Listen string `yaml:"listen"`
	// AdminListen is the admin port: /healthz, /readyz, /metrics, /openapi.json, /admin/v1/limits, pprof.
	AdminListen string `yaml:"admin_listen"`
	// MaxBodyBytes bounds a request body; a larger one is 413.
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// ReadTimeout bounds reading one request, counted from its first byte (408 past it).
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds writing one answer.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout closes a keep-alive connection that sends nothing this long.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// Concurrency caps the connections the public port serves at once (fasthttp's Concurrency).
	Concurrency int `yaml:"concurrency"`
	// AdmitTimeout bounds the admission call to Redis; past it the answer is 503 and the order id is released in the background.
	AdmitTimeout time.Duration `yaml:"admit_timeout"`
	// PublishTimeout bounds the JetStream publish and its ack; past it the reservation is released and the answer is 503.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// ShutdownTimeout bounds a graceful stop: requests in flight finish, then the process exits.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// SaleRefresh is how often a gateway re-reads every live sale into its cache (events carry changes at once; this heals a lost one).
	SaleRefresh time.Duration `yaml:"sale_refresh"`
	// NodeLeaseTTL is the lifetime of the order-id node a gateway leases from Redis (renewed while it runs).
	NodeLeaseTTL time.Duration `yaml:"node_lease_ttl"`
	// NodeIDs is the range "from-to" of order-id nodes this gateway leases
	// from ("": all, 0-1007). Its Redis user may write only those lease keys
	// when the roles give each gateway its own (docs/credentials.md).
	NodeIDs string `yaml:"node_ids"`
	// ReusePort lets several gateway processes listen on one port (SO_REUSEPORT),
	// the kernel spreading connections over them: one process per core.
	ReusePort bool `yaml:"reuseport"`
	// MaxHeaderBytes bounds the request line and headers (fasthttp's read buffer).
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxConns caps the public port's open connections; past it a new
	// connection gets a 503 and is closed (0: the file-descriptor limit less
	// headroom for the gateway's own connections; never above Concurrency).
	MaxConns int `yaml:"max_conns"`
	// MaxConnsPerIP bounds concurrent connections from one peer address (0:
	// none). Trusted proxies are exempt: behind nginx every connection comes
	// from nginx's address.
	MaxConnsPerIP int `yaml:"max_conns_per_ip"`
	// LingerTimeout and LingerMaxBytes bound the lingering close: after an
	// error answer (413, 400, ...) the gateway half-closes and discards what
	// the client still sends, so the client reads the answer, not a reset.
	LingerTimeout  time.Duration `yaml:"linger_timeout"`
	LingerMaxBytes int           `yaml:"linger_max_bytes"`
	// TrustedProxies are the CIDRs whose X-Forwarded-For / X-Real-IP are believed.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// TokenCacheSize bounds the verified-token cache (0 turns it off).
	TokenCacheSize int `yaml:"token_cache_size"`
	// LimiterMaxKeys bounds each keyed rate limiter (per IP, per user).
	LimiterMaxKeys int `yaml:"limiter_max_keys"`
	// BreakerFailures consecutive dependency failures open a breaker for BreakerOpen.
	BreakerFailures int           `yaml:"breaker_failures"`
	BreakerOpen     time.Duration `yaml:"breaker_open"`
	// MemoryLimitMB is the Go runtime's soft memory limit of a gateway
	// process (debug.SetMemoryLimit, set by `flashgate gateway`; 0: none):
	// the garbage collector and scavenger work harder near it instead of
	// letting the heap double.
	MemoryLimitMB int `yaml:"memory_limit_mb"`
	// ReleaseWorkers undo, in the background, the reservations of admissions
	// and publishes that failed; ReleaseQueue bounds what waits for them
	// (beyond it a reservation is left to reconcile).
	ReleaseWorkers int `yaml:"release_workers"`
	ReleaseQueue   int `yaml:"release_queue"`
	// AccessLogSample is the share of requests the gateway writes an access
	// log line for (0: none, 1: every one; 0.01 logs one in a hundred), with
	// the request id nginx set (X-Request-Id) or the gateway made.
	AccessLogSample float64 `yaml:"access_log_sample"`
	// EdgeMarksDir is a directory an nginx on the same host reads: while a
	// sale is sold out the gateway keeps a file <sale>.<unix second> there
	// for the current second and the next, and nginx answers the sale's
	// purchases 409 itself (docs/gateway.md). "": no marks (nginx then keeps the
	// gateway's sold-out 409 for the rest of its second).
	EdgeMarksDir string `yaml:"edge_marks_dir"`
}

// RateLimit is the ops-tunable block of docs/design.md §9 (binding). It reloads
// without a restart.
type RateLimit struct {
	// Mode is where the per-user and per-sale budgets live: "local" (each
	// gateway its own, the default) or "global" (in Redis, shared by the
	// fleet: docs/gateway.md, "Rate limits"). Per-IP stays local in both.
	Mode string `yaml:"mode" json:"mode"`
	// PerIP limits requests per client address: an IPv4 address, or an IPv6
	// /64 (one subscriber's block: a host may send from any address of it).
	PerIP Rate `yaml:"per_ip" json:"per_ip"`
	// PerNet limits requests per IPv6 /48, a looser tier above per_ip (a
	// site's block: 65,536 /64s). IPv4 clients have no such tier.
	PerNet Rate `yaml:"per_net" json:"per_net"`
	// PerUser limits requests per JWT subject.
	PerUser Rate `yaml:"per_user" json:"per_user"`
	// PerSale limits admissions per sale per gateway (global mode: per fleet).
	PerSale Rate `yaml:"per_sale" json:"per_sale"`
	// PerUserView limits a JWT subject's GETs of orders, per gateway (local
	// in both modes): apart from per_user, so polling an order's status
	// does not use up the buyer's purchases.
	PerUserView Rate `yaml:"per_user_view" json:"per_user_view"`
	// MaxInflight caps the requests past pre-validation at once per gateway (0: no cap); past it, 429.
	MaxInflight int `yaml:"max_inflight" json:"max_inflight"`
}

// The rate-limit modes (RateLimit.Mode; "" is local).
const (
	RateLocal  = "local"
	RateGlobal = "global"
)

// Global reports whether the per-user and per-sale budgets are fleet-wide.
func (r *RateLimit) Global() bool { return r.Mode == RateGlobal }

// Rate is a token bucket: Rate tokens a second, up to Burst at once. A Rate of
// 0 turns the limit off.
type Rate struct {
	// Rate is tokens a second (0 turns the limit off).
	Rate float64 `yaml:"rate" json:"rate"`
	// Burst is the bucket's size: the requests allowed at once.
	Burst int `yaml:"burst" json:"burst"`
}

// Backend is the order-writing process.
type Backend struct {
	// AdminListen is the backend's admin API (docs/api.md), probes, /metrics and /openapi.json.
	AdminListen string `yaml:"admin_listen"`
	// BatchSize is the most orders one MySQL transaction writes (1..5000).
	BatchSize int `yaml:"batch_size"`
	// BatchWait is how long the consumer waits to fill a batch before it writes what it has.
	BatchWait time.Duration `yaml:"batch_wait"`
	// MaxAckPending bounds the messages the durable consumer has delivered and not yet acked.
	MaxAckPending int `yaml:"max_ack_pending"`
	// MaxDeliver deliveries of a message that keeps failing send it to the dead-letter stream.
	// The backend counts them (the server never gives up on a message), and an outage spends none.
	MaxDeliver int `yaml:"max_deliver"`
	// AckWait: a message not acked this long after delivery is delivered again.
	AckWait time.Duration `yaml:"ack_wait"`
	// ShutdownTimeout bounds a graceful stop: the batch in hand commits, then the process exits.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// ClockSkew is how far apart the clocks of Redis, the gateways, NATS and MySQL may be when the backend checks an order's times: its created time against its id's time and JetStream's own time of the message (docs/ingest.md, "The backend trusts no message"); an order outside it ends failed, unadmitted. It must cover the servers' skew plus gateway.admit_timeout.
	ClockSkew time.Duration `yaml:"clock_skew"`
}

// Auth verifies buyers' JWTs. At most one of JWTSecret (HS256) and
// EdDSAPublicKeyFile (EdDSA) is the default key, which verifies tokens with no
// kid header; Keys verify tokens by their kid, so a new key can sign while
// tokens of the old one still verify.
type Auth struct {
	// JWTSecret verifies HS256 tokens without a kid header (at least 32 bytes outside dev mode).
	JWTSecret string `yaml:"jwt_secret" env:"JWT_SECRET"`
	// EdDSAPublicKeyFile is a PEM Ed25519 public key verifying EdDSA tokens without a kid header.
	EdDSAPublicKeyFile string `yaml:"eddsa_public_key_file"`
	// Keys are the verification keys chosen by a token's kid header.
	Keys []Key `yaml:"keys"`
	// SigningKid is the key `flashgate token` signs with: a kid of Keys with
	// a secret, or "" for jwt_secret (no kid header).
	SigningKid string `yaml:"signing_kid"`
	// MaxTokenTTL bounds a token's lifetime: exp - iat, or exp - now for a
	// token without iat.
	MaxTokenTTL time.Duration `yaml:"max_token_ttl"`
	// Issuer is the iss the default key's tokens must carry ("" = "flashgate"); a key of keys without an issuer of its own has this one.
	Issuer string `yaml:"issuer"`
	// SubjectPrefix is what the default key's tokens' sub must start with ("" = any user: a key of the operator's own).
	SubjectPrefix string `yaml:"subject_prefix"`
	// AudienceOptional accepts a token without aud (one with aud must still name flashgate); off: aud is required.
	AudienceOptional bool `yaml:"audience_optional"`
}

// Key is one verification key: an HS256 Secret or an Ed25519 PublicKeyFile
// (PEM), exactly one of them.
type Key struct {
	Kid           string `yaml:"kid" json:"kid"`
	Secret        string `yaml:"secret,omitempty" json:"secret,omitempty"`
	PublicKeyFile string `yaml:"public_key_file,omitempty" json:"public_key_file,omitempty"`
	// Issuer is the iss this key's tokens must carry ("": auth.issuer).
	Issuer string `yaml:"issuer,omitempty" json:"issuer,omitempty"`
	// SubjectPrefix is what this key's tokens' sub must start with, and be
	// longer than ("": any user). A partner's key gets the partner's own
	// namespace, so it cannot sign for anyone else's buyers.
	SubjectPrefix string `yaml:"subject_prefix,omitempty" json:"subject_prefix,omitempty"`
}

// Admin guards the backend's admin API.
type Admin struct {
	// Token is the bearer token of both admin ports (at least 24 bytes outside dev mode; empty refuses every admin request).
	Token string `yaml:"token"`
	// URL is where the CLI finds the backend's admin API.
	URL string `yaml:"url"`
	// Keys are the admin API's credentials, each with an id (recorded in the admin audit log) and a role: viewer (reads) or operator (reads and changes); token, when set, is one more operator key with id "default" (docs/credentials.md).
	Keys []AdminKey `yaml:"keys"`
	// AllowedHosts are the Host headers both admin ports answer, as host or host:port (empty: the port's listen address, localhost, 127.0.0.1 and [::1]); any other gets 421 (DNS rebinding).
	AllowedHosts []string `yaml:"allowed_hosts"`
}

// Admin roles: a viewer reads (the live view, ledgers, orders, audits,
// exports, the audit log); an operator also changes (create, update, pause,
// close, cancel, redrive).
const (
	RoleViewer   = "viewer"
	RoleOperator = "operator"
)

// DefaultAdminKeyID is the id admin.token is recorded under.
const DefaultAdminKeyID = "default"

// AdminKey is one admin credential.
type AdminKey struct {
	ID    string `yaml:"id" json:"id"`
	Role  string `yaml:"role" json:"role"`
	Token string `yaml:"token" json:"token"`
}

// AdminKeys are admin.keys with admin.token (if set) as the operator key
// "default".
func (a Admin) AdminKeys() []AdminKey {
	keys := slices.Clone(a.Keys)
	if a.Token != "" {
		keys = append(keys, AdminKey{ID: DefaultAdminKeyID, Role: RoleOperator, Token: a.Token})
	}
	return keys
}

// Redis lists the seed addresses: one for a standalone Redis, several for a
// cluster (rueidis finds out which it is).
type Redis struct {
	// Addrs are the seed addresses: one for a standalone Redis, several for a cluster (rueidis finds out which it is).
	Addrs []string `yaml:"addrs"`
	// MaxFlushDelay lets the gateway's Redis connection gather the admissions
	// of concurrent requests into one write (rueidis MaxFlushDelay): fewer
	// syscalls for the gateway and for Redis, at most this much latency.
	MaxFlushDelay time.Duration `yaml:"max_flush_delay"`
	// WaitReplicas makes the gateway wait, after each admission, until this
	// many replicas of the sale's master have it (WAIT on the connection
	// that ran the script) before it publishes and answers 202; fewer within
	// WaitTimeout: 503 and the units released (docs/recovery.md). 0: no wait,
	// and a failover may lose what its master had not replicated yet. On a
	// sale split over stock buckets the transfers of units between buckets
	// wait too: a take is landed only once the giver's replicas have it, by
	// the gateway or by the backend's reconcile (docs/buckets.md).
	WaitReplicas int           `yaml:"wait_replicas"`
	WaitTimeout  time.Duration `yaml:"wait_timeout"`
	// Username and Password log in as a Redis ACL user (AUTH/HELLO). An
	// empty Username with a Password logs in as Redis's default user.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// NATS is JetStream for orders and core NATS for sale events.
type NATS struct {
	// URL is the NATS server (comma-separated for several).
	URL string `yaml:"url"`
	// Stream is the JetStream stream of orders; its dead letters go to <stream>_DLQ.
	Stream string `yaml:"stream"`
	// OrderSubject is the subject orders are published on (the stream's subject).
	OrderSubject string `yaml:"order_subject"`
	// EventSubject prefixes the sale events (<subject>.<sale>: created, closed, sold_out, restocked, warm).
	EventSubject string `yaml:"event_subject"`
	// CommandSubject carries pay and cancel from gateways to backends (core
	// NATS request-reply, one backend of the queue group answers).
	CommandSubject string `yaml:"command_subject"`
	// Consumer is the durable pull consumer all backends share.
	Consumer string `yaml:"consumer"`
	// Replicas of the stream (1 for a single server; 3 in a NATS cluster).
	Replicas int `yaml:"replicas"`
	// DedupWindow is the stream's duplicate window on Nats-Msg-Id (at least 2m, docs/design.md §7).
	DedupWindow time.Duration `yaml:"dedup_window"`
	// MaxStreamMsgs bounds the stream's messages (0: no bound).
	MaxStreamMsgs int64 `yaml:"max_stream_msgs"`
	// MaxMsgSize is the largest message the orders stream and its dead
	// letters take (an order is a few hundred bytes); MaxBytes bounds each
	// stream's size. A full stream refuses new orders (503), never drops one.
	MaxMsgSize int64 `yaml:"max_msg_size"`
	MaxBytes   int64 `yaml:"max_bytes"`
	// InboxPrefix is where this process's replies arrive (its requests'
	// answers, JetStream acks and deliveries): the NATS permissions let each
	// role subscribe to its own prefix only (docs/credentials.md). "" is the
	// default, _INBOX.
	InboxPrefix string `yaml:"inbox_prefix"`
	// User and Password log in to NATS; the server's permissions for that
	// user decide what this process may publish and subscribe to.
	User     string `yaml:"user"`
	Password string `yaml:"password"`
}

// MySQL is the source of truth.
type MySQL struct {
	// DSN is the go-sql-driver/mysql data source name of the source of truth.
	DSN string `yaml:"dsn"`
	// MaxOpenConns bounds the connection pool.
	MaxOpenConns int `yaml:"max_open_conns"`
	// AutoMigrate lets the backend apply pending schema migrations at start
	// (docs/storage.md). Off, a backend finding an older schema refuses to
	// start and asks for `flashgate migrate up`: in production a schema change
	// is a step someone takes, not a side effect of a deploy.
	AutoMigrate bool `yaml:"auto_migrate"`
}

// Orders sets the order life cycle.
type Orders struct {
	// PaymentTimeout: a confirmed order unpaid this long expires and its units go back.
	PaymentTimeout time.Duration `yaml:"payment_timeout"`
}

// Events sets the order events (docs/events.md): every status change of an
// order, written to MySQL's outbox in the transaction that makes it, and
// published by the backend leader to a JetStream stream of its own.
type Events struct {
	// Stream is the JetStream stream of order events (limits retention: consumers read it at their pace).
	Stream string `yaml:"stream"`
	// Subject prefixes the events: an order of sale S has its events on <subject>.S.
	Subject string `yaml:"subject"`
	// MaxAge: events older than this leave the stream.
	MaxAge time.Duration `yaml:"max_age"`
	// MaxBytes bounds the stream's size; past it the oldest events leave (0: no bound).
	MaxBytes int64 `yaml:"max_bytes"`
	// DedupWindow is the stream's duplicate window on Nats-Msg-Id (the event id): a republish within it after a crash is dropped.
	DedupWindow time.Duration `yaml:"dedup_window"`
	// BatchSize is the most events the publisher reads from the outbox and publishes at once (1..4000: JetStream's asynchronous publishes in flight).
	BatchSize int `yaml:"batch_size"`
	// Poll is how often the publisher looks at an empty outbox.
	Poll time.Duration `yaml:"poll"`
	// Webhook also delivers the events to a shop's HTTP endpoint, signed (for shops without NATS).
	Webhook Webhook `yaml:"webhook"`
}

// Webhook is the signed HTTP delivery of the order events (docs/events.md):
// the backend leader reads the order-events stream with a durable consumer
// of its own and POSTs each event, in stream order, to URL with the header
// Flashgate-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>.
type Webhook struct {
	// URL receives the events (POST, JSON body; a 2xx answer delivers it). Empty: no webhook.
	URL string `yaml:"url"`
	// Secret signs each delivery (32 bytes or more); set it with FLASHGATE_EVENTS_WEBHOOK_SECRET.
	Secret string `yaml:"secret"`
	// MaxAttempts: an event the endpoint refused this many times goes to the dead-letter stream <events.stream>_DLQ and the next one is delivered.
	MaxAttempts int `yaml:"max_attempts"`
	// Timeout bounds one delivery.
	Timeout time.Duration `yaml:"timeout"`
	// RetryMin and RetryMax bound the wait between attempts (doubling from RetryMin); later events wait too, so that each order's events arrive in order.
	RetryMin time.Duration `yaml:"retry_min"`
	RetryMax time.Duration `yaml:"retry_max"`
	// Consumer is the webhook's durable consumer of the order-events stream.
	Consumer string `yaml:"consumer"`
}

// Payments verifies the shop's payment service, which alone marks an order
// paid (POST /v1/payments, docs/payments.md).
type Payments struct {
	// Secret is the HMAC-SHA256 key the payment service signs with (at least
	// 32 bytes outside dev mode): one, or a list while a secret is rotated
	// (comma-separated in FLASHGATE_PAYMENTS_SECRET); a signature by any of
	// them is accepted. None: every payment is refused (401 bad_signature).
	Secret Secrets `yaml:"secret"`
}

// Secrets is one secret or a list of them: YAML takes a string or a list.
type Secrets []string

// UnmarshalYAML reads a string (one secret; "" for none) or a list.
func (s *Secrets) UnmarshalYAML(n *yaml.Node) error {
	var list []string
	if n.Kind == yaml.ScalarNode {
		var one string
		if err := n.Decode(&one); err != nil {
			return err
		}
		list = []string{one}
	} else if err := n.Decode(&list); err != nil {
		return err
	}
	*s = nil
	for _, v := range list {
		if v != "" {
			*s = append(*s, v)
		}
	}
	return nil
}

// Sales sets how long a sale stays in Redis and in gateways' memory after it
// is over (docs/retention.md). MySQL keeps every sale for good.
type Sales struct {
	// Retention: a sale that is over (ended or closed) and settled leaves Redis
	// this long after it ended; the backend leader deletes its keys.
	Retention time.Duration `yaml:"retention"`
	// LiveGrace: gateways load and keep a sale until this long after its
	// ends_at (answering 410 ended, order status, pay and cancel); past it a
	// gateway forgets the sale (404 sale_not_found) and its refresh no longer
	// reads it.
	LiveGrace time.Duration `yaml:"live_grace"`
}

// Default is the configuration of the local stack (docs/design.md §10).
func Default() Config {
	return Config{
		Gateway: Gateway{
			Listen: "127.0.0.1:8080", AdminListen: "127.0.0.1:8081",
			MaxBodyBytes: 1024, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
			IdleTimeout: 60 * time.Second, Concurrency: 256 * 1024,
			AdmitTimeout: 500 * time.Millisecond, PublishTimeout: 2 * time.Second,
			ShutdownTimeout: 10 * time.Second, SaleRefresh: 5 * time.Second, NodeLeaseTTL: 15 * time.Second,
			MaxHeaderBytes: 8192, MaxConnsPerIP: 128,
			LingerTimeout: 2 * time.Second, LingerMaxBytes: 1 << 20,
			TrustedProxies: []string{"127.0.0.1/32", "::1/128"},
			TokenCacheSize: 100000, LimiterMaxKeys: 1000000,
			BreakerFailures: 5, BreakerOpen: 2 * time.Second, MemoryLimitMB: 100,
			ReleaseWorkers: 8, ReleaseQueue: 10000,
		},
		RateLimit: RateLimit{
			Mode:        RateLocal,
			PerIP:       Rate{Rate: 20, Burst: 40},
			PerNet:      Rate{Rate: 320, Burst: 640},
			PerUser:     Rate{Rate: 5, Burst: 5},
			PerSale:     Rate{Rate: 50000, Burst: 5000},
			PerUserView: Rate{Rate: 10, Burst: 20},
			MaxInflight: 20000,
		},
		Backend: Backend{
			AdminListen: "127.0.0.1:8082", BatchSize: 500, BatchWait: 50 * time.Millisecond,
			MaxAckPending: 20000, MaxDeliver: 10, AckWait: 30 * time.Second, ShutdownTimeout: 15 * time.Second,
			ClockSkew: 5 * time.Second,
		},
		Admin: Admin{URL: "http://127.0.0.1:8082", Keys: []AdminKey{}, AllowedHosts: []string{}},
		Redis: Redis{Addrs: []string{"127.0.0.1:16379"}, MaxFlushDelay: 0, WaitTimeout: 250 * time.Millisecond},
		NATS: NATS{
			URL: "nats://127.0.0.1:14222", Stream: "FLASHGATE_ORDERS",
			OrderSubject: "flashgate.orders", EventSubject: "flashgate.events.sale", CommandSubject: "flashgate.cmd.orders",
			Consumer: "flashgate-backend", Replicas: 1, DedupWindow: 2 * time.Minute,
			MaxMsgSize: 64 << 10, MaxBytes: 1 << 30,
		},
		Auth:   Auth{Keys: []Key{}, MaxTokenTTL: 24 * time.Hour, Issuer: "flashgate"},
		MySQL:  MySQL{DSN: "root@tcp(127.0.0.1:13306)/flashgate", MaxOpenConns: 32},
		Orders: Orders{PaymentTimeout: 15 * time.Minute},
		Sales:  Sales{Retention: 7 * 24 * time.Hour, LiveGrace: 24 * time.Hour},
		Events: Events{Stream: "FLASHGATE_ORDER_EVENTS", Subject: "flashgate.order_events", MaxAge: 30 * 24 * time.Hour,
			MaxBytes: 1 << 30, DedupWindow: 10 * time.Minute, BatchSize: 500, Poll: 250 * time.Millisecond,
			Webhook: Webhook{MaxAttempts: 8, Timeout: 5 * time.Second, RetryMin: time.Second, RetryMax: time.Minute,
				Consumer: "flashgate-webhook"}},
	}
}

// shortEnv are the environment names docs/design.md gives, besides FLASHGATE_<KEY>.
var shortEnv = map[string]string{"FLASHGATE_ADMIN_TOKEN": "admin.token"}

// Load reads path (if not "") over the defaults, then the environment.
func Load(path string) (Config, error) {
	c := Default()
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return c, fmt.Errorf("config: %w", err)
		}
		if err := Parse(b, &c); err != nil {
			return c, fmt.Errorf("config %s: %w", path, err)
		}
	}
	if err := applyEnv(&c, os.LookupEnv); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	c.Source = path
	return c, c.Validate()
}

// Parse decodes YAML strictly over c.
func Parse(b []byte, c *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	// An empty file decodes to io.EOF: the defaults stand.
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	// A second document would be ignored silently: refuse it like an unknown key
	// (an empty one, as a trailing "---" makes, is harmless).
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		case len(extra.Content) > 0 && extra.Content[0].ShortTag() != "!!null":
			return fmt.Errorf("line %d: a second YAML document (one document only)", extra.Content[0].Line)
		}
	}
}

// Validate checks what the processes cannot run without.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Redis.Addrs) == 0 {
		errs = append(errs, errors.New("redis.addrs is empty"))
	}
	if c.NATS.Password != "" && c.NATS.User == "" {
		errs = append(errs, errors.New("nats.password is set without nats.user"))
	}
	if c.Redis.Username != "" && c.Redis.Password == "" {
		errs = append(errs, errors.New("redis.username is set without redis.password"))
	}
	if c.Gateway.MemoryLimitMB < 0 {
		errs = append(errs, errors.New("gateway.memory_limit_mb must not be negative"))
	}
	if c.Redis.MaxFlushDelay < 0 || c.Redis.MaxFlushDelay > 10*time.Millisecond {
		errs = append(errs, errors.New("redis.max_flush_delay must be 0..10ms"))
	}
	if c.Redis.WaitReplicas < 0 || c.Redis.WaitReplicas > 5 {
		errs = append(errs, errors.New("redis.wait_replicas must be 0..5"))
	}
	if c.Redis.WaitReplicas > 0 && (c.Redis.WaitTimeout < time.Millisecond || c.Redis.WaitTimeout >= c.Gateway.AdmitTimeout) {
		errs = append(errs, errors.New("redis.wait_timeout must be at least 1ms and below gateway.admit_timeout"))
	}
	if c.Gateway.MaxBodyBytes < 64 {
		errs = append(errs, errors.New("gateway.max_body_bytes must be at least 64"))
	}
	if c.Backend.BatchSize < 1 || c.Backend.BatchSize > 5000 {
		errs = append(errs, errors.New("backend.batch_size must be 1..5000"))
	}
	if c.Backend.ClockSkew < 100*time.Millisecond || c.Backend.ClockSkew > time.Minute {
		errs = append(errs, errors.New("backend.clock_skew must be 100ms..1m"))
	}
	if c.NATS.DedupWindow < 2*time.Minute {
		errs = append(errs, errors.New("nats.dedup_window must be at least 2m (docs/design.md §7)"))
	}
	if _, _, _, err := c.Gateway.NodeRange(); err != nil {
		errs = append(errs, err)
	}
	if c.NATS.MaxMsgSize < 4<<10 || c.NATS.MaxMsgSize > 64<<20 || c.NATS.MaxBytes < 1<<20 {
		errs = append(errs, errors.New("nats.max_msg_size must be 4KiB..64MiB and nats.max_bytes at least 1MiB"))
	}
	if p := c.NATS.InboxPrefix; strings.ContainsAny(p, "*> \t") || strings.HasSuffix(p, ".") {
		errs = append(errs, errors.New("nats.inbox_prefix: a subject without wildcards, not ending in '.'"))
	}
	if c.Orders.PaymentTimeout <= 0 {
		errs = append(errs, errors.New("orders.payment_timeout must be positive"))
	}
	errs = append(errs, c.Events.validate(c.NATS)...)
	errs = append(errs, c.checkAuth()...)
	for _, p := range c.Gateway.TrustedProxies {
		if _, err := netip.ParsePrefix(p); err != nil {
			errs = append(errs, fmt.Errorf("gateway.trusted_proxies: %w", err))
		}
	}
	if c.Gateway.MaxHeaderBytes < 1024 {
		errs = append(errs, errors.New("gateway.max_header_bytes must be at least 1024"))
	}
	if c.Gateway.MaxConns < 0 || c.Gateway.MaxConnsPerIP < 0 || c.Gateway.Concurrency < 0 {
		errs = append(errs, errors.New("gateway.max_conns, max_conns_per_ip and concurrency must not be negative (0: derived / no cap)"))
	}
	if c.Gateway.ReadTimeout <= 0 {
		errs = append(errs, errors.New("gateway.read_timeout must be positive: it bounds every connection's request"))
	}
	if c.Gateway.LingerTimeout < 0 || c.Gateway.LingerTimeout > 30*time.Second || c.Gateway.LingerMaxBytes < 0 {
		errs = append(errs, errors.New("gateway.linger_timeout must be 0..30s and linger_max_bytes not negative"))
	}
	if !(c.Gateway.AccessLogSample >= 0 && c.Gateway.AccessLogSample <= 1) {
		errs = append(errs, errors.New("gateway.access_log_sample must be between 0 and 1 (a share of requests)"))
	}
	if c.Gateway.LimiterMaxKeys < 1 {
		errs = append(errs, errors.New("gateway.limiter_max_keys must be positive"))
	}
	if c.Gateway.ReleaseWorkers < 1 || c.Gateway.ReleaseWorkers > 1024 {
		errs = append(errs, errors.New("gateway.release_workers must be 1..1024"))
	}
	if c.Gateway.ReleaseQueue < 1 {
		errs = append(errs, errors.New("gateway.release_queue must be positive"))
	}
	if c.Gateway.BreakerFailures < 1 || c.Gateway.BreakerOpen <= 0 {
		errs = append(errs, errors.New("gateway.breaker_failures and breaker_open must be positive"))
	}
	// The reconciler repairs (and may re-warm) a sale for an hour after it
	// ends: retiring it inside that hour would have its keys written again.
	if c.Sales.Retention < time.Hour {
		errs = append(errs, errors.New("sales.retention must be at least 1h"))
	}
	// A buyer pays or cancels through a gateway, which must still hold the
	// sale until the last payment deadline; and a gateway must not hold a sale
	// Redis has retired.
	if c.Sales.LiveGrace < c.Orders.PaymentTimeout || c.Sales.LiveGrace > c.Sales.Retention {
		errs = append(errs, errors.New("sales.live_grace must be between orders.payment_timeout and sales.retention"))
	}
	return errors.Join(append(errs, c.RateLimit.Validate())...)
}

// Secret strengths. An HS256 secret shorter than 32 bytes can be brute-forced
// offline from one token; the admin token is typed by people, 24 bytes of it
// is still far past guessing.
const (
	MinJWTSecretBytes  = 32
	MinAdminTokenBytes = 24
)

// published are secret values written in this repository (the local stack's):
// anyone can read them, so outside dev mode they are no secret.
var published = map[string]bool{
	"flashgate-local-dev-jwt-secret":  true,
	"flashgate-local-dev-admin-token": true,
}

// checkAuth checks the keys and secrets; weak or published ones pass only in
// dev mode.
func (c *Config) checkAuth() []error {
	var errs []error
	a := &c.Auth
	if a.JWTSecret != "" && a.EdDSAPublicKeyFile != "" {
		errs = append(errs, errors.New("auth: set jwt_secret or eddsa_public_key_file, not both"))
	}
	if a.MaxTokenTTL <= 0 {
		errs = append(errs, errors.New("auth.max_token_ttl must be positive"))
	}
	weak := func(what, v string, min int) {
		switch {
		case c.Dev:
		case published[v]:
			errs = append(errs, fmt.Errorf("%s is a value published in the flashgate repository: set a secret of your own (or FLASHGATE_DEV=1 for a local stack)", what))
		case len(v) < min:
			errs = append(errs, fmt.Errorf("%s is %d bytes, at least %d are needed (or FLASHGATE_DEV=1 for a local stack)", what, len(v), min))
		}
	}
	if a.JWTSecret != "" {
		weak("auth.jwt_secret (FLASHGATE_JWT_SECRET)", a.JWTSecret, MinJWTSecretBytes)
	}
	for i, p := range c.Payments.Secret {
		weak(fmt.Sprintf("payments.secret[%d] (FLASHGATE_PAYMENTS_SECRET)", i), p, MinJWTSecretBytes)
		if strings.Contains(p, ",") {
			errs = append(errs, fmt.Errorf("payments.secret[%d]: a comma cannot be in a secret (FLASHGATE_PAYMENTS_SECRET separates them with commas)", i))
		}
	}
	// An empty admin token closes the admin API (every request refused).
	if c.Admin.Token != "" {
		weak("admin.token (FLASHGATE_ADMIN_TOKEN)", c.Admin.Token, MinAdminTokenBytes)
	}
	adminIDs, adminTokens := map[string]bool{}, map[string]bool{}
	for i, k := range c.Admin.AdminKeys() {
		switch {
		case k.ID == "":
			errs = append(errs, fmt.Errorf("admin.keys[%d]: id is empty", i))
		case adminIDs[k.ID]:
			errs = append(errs, fmt.Errorf("admin.keys[%d]: id %q given twice (admin.token is the key %q)", i, k.ID, DefaultAdminKeyID))
		case k.Role != RoleViewer && k.Role != RoleOperator:
			errs = append(errs, fmt.Errorf("admin.keys[%d] (%s): role %q, want viewer or operator", i, k.ID, k.Role))
		case k.Token == "":
			errs = append(errs, fmt.Errorf("admin.keys[%d] (%s): token is empty", i, k.ID))
		case adminTokens[k.Token]:
			errs = append(errs, fmt.Errorf("admin.keys[%d] (%s): the same token as another key", i, k.ID))
		default:
			if k.Token != c.Admin.Token || k.ID != DefaultAdminKeyID {
				weak("admin.keys["+k.ID+"].token", k.Token, MinAdminTokenBytes)
			}
		}
		adminIDs[k.ID], adminTokens[k.Token] = true, true
	}
	kids := map[string]bool{}
	for i, k := range a.Keys {
		switch {
		case k.Kid == "":
			errs = append(errs, fmt.Errorf("auth.keys[%d]: kid is empty", i))
		case kids[k.Kid]:
			errs = append(errs, fmt.Errorf("auth.keys: kid %q twice", k.Kid))
		}
		kids[k.Kid] = true
		if (k.Secret == "") == (k.PublicKeyFile == "") {
			errs = append(errs, fmt.Errorf("auth.keys[%d] (kid %q): set secret or public_key_file, exactly one", i, k.Kid))
		}
		if k.Secret != "" {
			weak(fmt.Sprintf("auth.keys[%d] (kid %q) secret", i, k.Kid), k.Secret, MinJWTSecretBytes)
		}
	}
	prefix := func(what, p string) {
		if p != "" && !flashgate.ValidID(p) {
			errs = append(errs, fmt.Errorf("%s %q: up to 64 characters of [A-Za-z0-9_-]", what, p))
		}
	}
	prefix("auth.subject_prefix", a.SubjectPrefix)
	for i, k := range a.Keys {
		prefix(fmt.Sprintf("auth.keys[%d] (kid %q) subject_prefix", i, k.Kid), k.SubjectPrefix)
	}
	if a.SigningKid != "" {
		i := slices.IndexFunc(a.Keys, func(k Key) bool { return k.Kid == a.SigningKid })
		if i < 0 || a.Keys[i].Secret == "" {
			errs = append(errs, fmt.Errorf("auth.signing_kid %q names no key of auth.keys with a secret", a.SigningKid))
		}
	}
	return errs
}

// Validate checks the rate-limit block alone: a reload that fails it keeps
// the limits in force.
func (r *RateLimit) Validate() error {
	var errs []error
	for _, x := range []struct {
		name string
		r    Rate
	}{{"per_ip", r.PerIP}, {"per_net", r.PerNet}, {"per_user", r.PerUser}, {"per_sale", r.PerSale}, {"per_user_view", r.PerUserView}} {
		switch {
		case x.r.Rate < 0 || x.r.Burst < 0:
			errs = append(errs, fmt.Errorf("ratelimit.%s: rate and burst must not be negative", x.name))
		case x.r.Rate > 0 && x.r.Burst < 1:
			errs = append(errs, fmt.Errorf("ratelimit.%s: burst must be at least 1 when rate is set", x.name))
		case x.r.Rate > 1e9:
			errs = append(errs, fmt.Errorf("ratelimit.%s: rate above 1e9/s", x.name))
		}
	}
	if r.MaxInflight < 0 {
		errs = append(errs, errors.New("ratelimit.max_inflight must not be negative (0: no cap)"))
	}
	switch r.Mode {
	case "", RateLocal, RateGlobal:
	default:
		errs = append(errs, fmt.Errorf("ratelimit.mode %q: local or global", r.Mode))
	}
	return errors.Join(errs...)
}

// applyEnv walks the struct and overrides each field from FLASHGATE_<PATH>.
func applyEnv(c *Config, lookup func(string) (string, bool)) error {
	for env, path := range shortEnv {
		if v, ok := lookup(env); ok {
			if err := setPath(reflect.ValueOf(c).Elem(), strings.Split(path, "."), v); err != nil {
				return fmt.Errorf("%s: %w", env, err)
			}
		}
	}
	return walk(reflect.ValueOf(c).Elem(), "FLASHGATE", lookup)
}

func walk(v reflect.Value, prefix string, lookup func(string) (string, bool)) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.ToUpper(strings.Split(f.Tag.Get("yaml"), ",")[0])
		if name == "-" {
			continue
		}
		env := prefix + "_" + name
		if f.Type.Kind() == reflect.Struct {
			if err := walk(v.Field(i), env, lookup); err != nil {
				return err
			}
			continue
		}
		names := []string{env}
		if short := f.Tag.Get("env"); short != "" {
			names = append(names, "FLASHGATE_"+short)
		}
		for _, n := range names {
			if s, ok := lookup(n); ok {
				if err := setValue(v.Field(i), s); err != nil {
					return fmt.Errorf("%s: %w", n, err)
				}
			}
		}
	}
	return nil
}

func setPath(v reflect.Value, path []string, s string) error {
	for _, p := range path {
		t := v.Type()
		found := false
		for i := 0; i < t.NumField(); i++ {
			if strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0] == p {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return fmt.Errorf("no key %s", p)
		}
	}
	return setValue(v, s)
}

func setValue(v reflect.Value, s string) error {
	switch v.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		v.SetInt(int64(d))
		return nil
	case []string:
		if s == "" && v.Len() == 0 {
			return nil // empty stays empty (nil or not), as the file had it
		}
		v.Set(reflect.ValueOf(commaList(s)))
		return nil
	case Secrets:
		v.Set(reflect.ValueOf(Secrets(commaList(s))))
		return nil
	}
	switch v.Kind() {
	case reflect.Slice:
		// A list of blocks (auth.keys) in YAML flow form:
		// FLASHGATE_AUTH_KEYS='[{kid: k2, secret: ...}]'. Strict like the file.
		dec := yaml.NewDecoder(strings.NewReader(s))
		dec.KnownFields(true)
		n := reflect.New(v.Type())
		if err := dec.Decode(n.Interface()); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		v.Set(n.Elem())
	case reflect.String:
		v.SetString(s)
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		v.SetFloat(f)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		v.SetInt(n)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		v.SetBool(b)
	default:
		return fmt.Errorf("unsupported kind %s", v.Kind())
	}
	return nil
}

// commaList splits an environment list; empty entries are dropped.
func commaList(s string) []string {
	var parts []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			parts = append(parts, p)
		}
	}
	return parts
}

// Environ is c as environment variables, the inverse of the overrides Load
// reads: one FLASHGATE_… entry per key (a key's short name where it has one,
// since that name wins). A child process given os.Environ() plus these, and
// no config file, runs with exactly c.
func Environ(c Config) []string {
	var out []string
	environ(reflect.ValueOf(c), "FLASHGATE", &out)
	return out
}

func environ(v reflect.Value, prefix string, out *[]string) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.ToUpper(strings.Split(f.Tag.Get("yaml"), ",")[0])
		if name == "-" {
			continue
		}
		env := prefix + "_" + name
		if f.Type.Kind() == reflect.Struct {
			environ(v.Field(i), env, out)
			continue
		}
		if short := f.Tag.Get("env"); short != "" {
			env = "FLASHGATE_" + short
		}
		var s string
		switch x := v.Field(i).Interface().(type) {
		case time.Duration:
			s = x.String()
		case []string:
			s = strings.Join(x, ",")
		case Secrets:
			s = strings.Join(x, ",")
		case float64:
			s = strconv.FormatFloat(x, 'g', -1, 64)
		case []Key:
			b, _ := json.Marshal(x) // JSON is YAML flow form
			s = string(b)
		case []AdminKey:
			b, _ := json.Marshal(x)
			s = string(b)
		default:
			s = fmt.Sprint(x)
		}
		*out = append(*out, env+"="+s)
	}
}

func (e *Events) validate(n NATS) []error {
	var errs []error
	if e.Stream == "" || e.Stream == n.Stream || e.Stream == n.Stream+"_DLQ" {
		errs = append(errs, errors.New("events.stream must be set, and not be nats.stream or its dead-letter stream"))
	}
	if e.Subject == "" || e.Subject == n.OrderSubject || strings.HasPrefix(e.Subject, n.OrderSubject+".") ||
		e.Subject == n.EventSubject || strings.HasPrefix(e.Subject, n.EventSubject+".") {
		errs = append(errs, errors.New("events.subject must be set, outside nats.order_subject and nats.event_subject"))
	}
	if e.MaxAge <= 0 || e.MaxBytes < 0 {
		errs = append(errs, errors.New("events.max_age must be positive and events.max_bytes not negative"))
	}
	if e.DedupWindow < 2*time.Minute || e.DedupWindow > e.MaxAge {
		errs = append(errs, errors.New("events.dedup_window must be at least 2m and at most events.max_age"))
	}
	if e.BatchSize < 1 || e.BatchSize > 4000 || e.Poll <= 0 {
		errs = append(errs, errors.New("events.batch_size must be 1..4000 and events.poll positive"))
	}
	if w := e.Webhook; w.URL != "" {
		if u, err := url.Parse(w.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("events.webhook.url %q: an http or https URL", w.URL))
		}
		if len(w.Secret) < MinWebhookSecretBytes {
			errs = append(errs, fmt.Errorf("events.webhook.secret (FLASHGATE_EVENTS_WEBHOOK_SECRET) is %d bytes, at least %d are needed", len(w.Secret), MinWebhookSecretBytes))
		}
		if w.MaxAttempts < 1 || w.MaxAttempts > 100 || w.Timeout <= 0 || w.RetryMin <= 0 || w.RetryMax < w.RetryMin || w.Consumer == "" {
			errs = append(errs, errors.New("events.webhook: max_attempts 1..100, timeout and retry_min positive, retry_max at least retry_min, consumer set"))
		}
	}
	return errs
}

// MinWebhookSecretBytes is the shortest webhook secret: the shop verifies
// every event with it.
const MinWebhookSecretBytes = 32

// NodeRange is NodeIDs as numbers: ok is false for "" (every node).
func (g Gateway) NodeRange() (from, to int, ok bool, err error) {
	if g.NodeIDs == "" {
		return 0, 0, false, nil
	}
	a, b, found := strings.Cut(g.NodeIDs, "-")
	from, err1 := strconv.Atoi(a)
	to, err2 := strconv.Atoi(b)
	if !found || err1 != nil || err2 != nil || from < 0 || from > to {
		return 0, 0, false, fmt.Errorf("gateway.node_ids %q: want from-to, 0 <= from <= to", g.NodeIDs)
	}
	return from, to, true, nil
}

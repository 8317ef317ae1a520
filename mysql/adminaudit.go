package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// AdminChange is one row of the admin audit log (migration 0012): who (the
// admin key's id and role, and the address the request came from) changed
// what (an action on a sale, or on an order or message of it), when (MySQL's
// clock), and the state before and after as JSON (null where there was none).
type AdminChange struct {
	ID     uint64          `json:"id"`
	At     time.Time       `json:"at"`
	KeyID  string          `json:"key_id"`
	Role   string          `json:"role"`
	Source string          `json:"source"`
	Action string          `json:"action"`
	SaleID string          `json:"sale_id,omitempty"`
	Target string          `json:"target,omitempty"`
	Before json.RawMessage `json:"before,omitempty"`
	After  json.RawMessage `json:"after,omitempty"`
}

// RecordAdminChange appends c to the admin audit log (in q's transaction,
// when q is one); its time is MySQL's.
func RecordAdminChange(ctx context.Context, q Querier, c AdminChange) error {
	_, err := q.ExecContext(ctx, `INSERT INTO admin_audit (at, key_id, role, source, action, sale_id, target, before_json, after_json)
		VALUES (UTC_TIMESTAMP(3), ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.KeyID, c.Role, c.Source, c.Action, nullString(c.SaleID), nullString(c.Target), rawOrNull(c.Before), rawOrNull(c.After))
	if err != nil {
		return fmt.Errorf("admin audit log: %w", err)
	}
	return nil
}

// AdminChanges lists the log newest first: of one sale (sale != ""), with ids
// below before (0: from the newest), at most limit rows.
func AdminChanges(ctx context.Context, q Querier, sale string, before uint64, limit int) ([]AdminChange, error) {
	where, args := "WHERE 1 = 1", []any{}
	if sale != "" {
		where, args = where+" AND sale_id = ?", append(args, sale)
	}
	if before > 0 {
		where, args = where+" AND id < ?", append(args, before)
	}
	rows, err := q.QueryContext(ctx, `SELECT id, at, key_id, role, source, action, COALESCE(sale_id, ''), COALESCE(target, ''),
		before_json, after_json FROM admin_audit `+where+` ORDER BY id DESC LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("admin audit log: %w", err)
	}
	out := []AdminChange{}
	err = scanRows(rows, func() error {
		var c AdminChange
		var before, after sql.NullString
		if err := rows.Scan(&c.ID, &c.At, &c.KeyID, &c.Role, &c.Source, &c.Action, &c.SaleID, &c.Target, &before, &after); err != nil {
			return err
		}
		c.Before, c.After = rawOf(before), rawOf(after)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("admin audit log: %w", err)
	}
	return out, nil
}

// SetSalePaused records the sale's pause (or its end) in MySQL, where a
// rebuild of Redis reads it (lua.MetaFields).
func SetSalePaused(ctx context.Context, q Querier, id string, paused bool) error {
	// The caller holds the sale row lock (LockSale): the sale exists.
	if _, err := q.ExecContext(ctx, `UPDATE sales SET paused = ?, updated_at = UTC_TIMESTAMP(3) WHERE id = ?`, paused, id); err != nil {
		return fmt.Errorf("pause sale %s: %w", id, err)
	}
	return nil
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func rawOrNull(b json.RawMessage) any {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	return string(b)
}

func rawOf(s sql.NullString) json.RawMessage {
	if !s.Valid {
		return nil
	}
	return json.RawMessage(s.String)
}

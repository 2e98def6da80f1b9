package subjects

import (
	"encoding/json"
	"strconv"
)

// AppendEvent appends the JSON of e to b: the same bytes as json.Marshal(e), written directly when
// its times are UTC (the broker's always are) and through encoding/json otherwise. The broker
// encodes every transition it publishes, so this is on its busiest path: it is several times faster
// than reflection, mostly by not going through time.Time's MarshalJSON.
func AppendEvent(b []byte, e *Event) ([]byte, error) {
	if !e.plain() {
		data, err := json.Marshal(e)
		return append(b, data...), err
	}
	b = append(b, `{"queue":`...)
	b = AppendString(b, e.Queue)
	b = append(b, `,"id":`...)
	b = AppendString(b, e.ID)
	b = append(b, `,"kind":`...)
	b = AppendString(b, string(e.Kind))
	b = append(b, `,"state":`...)
	b = AppendString(b, string(e.State))
	if e.PrevState != "" {
		b = append(b, `,"prev_state":`...)
		b = AppendString(b, string(e.PrevState))
	}
	if e.Reason != "" {
		b = append(b, `,"reason":`...)
		b = AppendString(b, e.Reason)
	}
	if e.Error != "" {
		b = append(b, `,"error":`...)
		b = AppendString(b, e.Error)
	}
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, e.Version, 10)
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(e.Attempts), 10)
	b = append(b, `,"max_attempts":`...)
	b = strconv.AppendInt(b, int64(e.MaxAttempts), 10)
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, e.Priority, 10)
	if len(e.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		b = appendStringMap(b, e.Metadata, &htmlSafe)
	}
	if e.PayloadSize != 0 {
		b = append(b, `,"payload_size":`...)
		b = strconv.AppendInt(b, int64(e.PayloadSize), 10)
	}
	if e.LeaseID != "" {
		b = append(b, `,"lease_id":`...)
		b = AppendString(b, e.LeaseID)
	}
	if e.LeaseExpiresAt != nil {
		b = append(b, `,"lease_expires_at":`...)
		b = appendTime(b, *e.LeaseExpiresAt)
	}
	if e.RequestID != "" {
		b = append(b, `,"request_id":`...)
		b = AppendString(b, e.RequestID)
	}
	if e.Worker != "" {
		b = append(b, `,"worker":`...)
		b = AppendString(b, e.Worker)
	}
	if e.VisibleAt != nil {
		b = append(b, `,"visible_at":`...)
		b = appendTime(b, *e.VisibleAt)
	}
	b = append(b, `,"at":`...)
	b = appendTime(b, e.At)
	return append(b, '}'), nil
}

// plain reports whether AppendEvent can write e directly: every time is plainTime.
func (e *Event) plain() bool {
	return plainTime(e.At) && (e.LeaseExpiresAt == nil || plainTime(*e.LeaseExpiresAt)) &&
		(e.VisibleAt == nil || plainTime(*e.VisibleAt))
}

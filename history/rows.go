package history

import (
	"encoding/base64"
	"encoding/json"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// commandRow is a row of the commands table. Nullable columns are pointers.
// JSON columns are text so that the caller's bytes come back unchanged.
type commandRow struct {
	CommandID         string `gorm:"primaryKey"`
	UserID            string
	ClientID          string
	ContextID         string
	TaskID            string
	Epoch             int64
	Name              string
	Params            *string
	Target            *string
	Options           *string
	ResponseMode      string
	Status            string
	StatusRank        int
	ErrorCode         *string
	ErrorMessage      *string
	ErrorData         *string
	TraceID           string
	CallbackURL       *string
	CallbackKeyID     *string
	CreatedAt         time.Time
	DispatchedAt      *time.Time
	AckedAt           *time.Time
	FinishedAt        *time.Time
	DeliveryAttempts  int
	Delivered         bool
	DeliveryLastError *string
	DeliveryNextAt    *time.Time
}

func (commandRow) TableName() string { return "commands" }

// messageRow is a row of the messages table. A capture keeps its bytes in
// Blob and has no Data.
type messageRow struct {
	CommandID string `gorm:"primaryKey;autoIncrement:false"`
	Seq       int64  `gorm:"primaryKey;autoIncrement:false"`
	Kind      string
	Name      string
	Data      *string
	Code      string
	Message   string
	Mime      string
	Blob      []byte
	Late      bool
	At        time.Time
}

func (messageRow) TableName() string { return "messages" }

// keyRow is a row of the keys table.
type keyRow struct {
	ID            string `gorm:"primaryKey"`
	Kind          string
	UserID        *string
	TenantID      *string
	Name          string
	Hash          []byte
	WebhookSecret *string
	CreatedAt     time.Time
	RevokedAt     *time.Time
}

func (keyRow) TableName() string { return "keys" }

func newCommandRow(op InsertCommand) commandRow {
	r := op.Rec
	st := r.Status
	if st == "" {
		st = cheetah.StatusAdmitted
	}
	created := r.CreatedAt
	if created.IsZero() {
		created = time.Now()
	}
	row := commandRow{
		CommandID:    r.CommandID,
		UserID:       r.UserID,
		ClientID:     r.ClientID,
		ContextID:    r.ContextID,
		TaskID:       r.TaskID,
		Epoch:        r.Epoch,
		Name:         r.Name,
		Params:       jsonText(r.Params),
		Target:       jsonText(r.Target),
		Options:      jsonText(r.Options),
		ResponseMode: string(r.ResponseMode),
		Status:       string(st),
		StatusRank:   st.Rank(),
		TraceID:      r.TraceID,
		CallbackURL:  text(op.CallbackURL),
		CreatedAt:    utc(created),
		DispatchedAt: utcPtr(r.DispatchedAt),
		AckedAt:      utcPtr(r.AckedAt),
		FinishedAt:   utcPtr(r.FinishedAt),
	}
	if e := r.Error; e != nil {
		row.ErrorCode, row.ErrorMessage, row.ErrorData = &e.Code, text(e.Message), jsonText(e.Data)
	}
	if op.CallbackURL != "" {
		// A key id without a URL would sign nothing.
		row.CallbackKeyID = text(op.CallbackKeyID)
		if st.Terminal() {
			// Inserted already ended: its delivery is due, as SetStatus
			// would have made it.
			due := row.CreatedAt
			if row.FinishedAt != nil {
				due = *row.FinishedAt
			}
			row.DeliveryNextAt = &due
		}
	}
	return row
}

func (r commandRow) record() cheetah.CommandRecord {
	rec := cheetah.CommandRecord{
		CommandID:    r.CommandID,
		UserID:       r.UserID,
		ClientID:     r.ClientID,
		ContextID:    r.ContextID,
		TaskID:       r.TaskID,
		Epoch:        r.Epoch,
		Name:         r.Name,
		Params:       rawJSON(r.Params),
		Target:       rawJSON(r.Target),
		Options:      rawJSON(r.Options),
		ResponseMode: cheetah.ResponseMode(r.ResponseMode),
		Status:       cheetah.Status(r.Status),
		TraceID:      r.TraceID,
		CreatedAt:    r.CreatedAt.UTC(),
		DispatchedAt: readTime(r.DispatchedAt),
		AckedAt:      readTime(r.AckedAt),
		FinishedAt:   readTime(r.FinishedAt),
	}
	if r.ErrorCode != nil {
		rec.Error = &cheetah.ErrorInfo{Code: *r.ErrorCode, Message: deref(r.ErrorMessage), Data: rawJSON(r.ErrorData)}
	}
	if r.CallbackURL != nil {
		rec.Delivery = &cheetah.Delivery{
			URL:       *r.CallbackURL,
			Attempts:  r.DeliveryAttempts,
			Delivered: r.Delivered,
			LastError: deref(r.DeliveryLastError),
		}
	}
	return rec
}

func newMessageRow(op AppendMessage, seq int64) messageRow {
	m := op.Msg
	at := m.At
	if at.IsZero() {
		at = time.Now()
	}
	row := messageRow{
		CommandID: op.CommandID,
		Seq:       seq,
		Kind:      string(m.Kind),
		Name:      m.Name,
		Data:      jsonText(m.Data),
		Code:      m.Code,
		Message:   m.Message,
		Mime:      m.Mime,
		Late:      m.Late,
		At:        utc(at),
	}
	if m.Kind == cheetah.KindCapture {
		// Captures are stored as bytes: a third smaller than base64 text,
		// and readable by any SQL client as what they are.
		row.Data = nil
		row.Blob = op.Bytes
		if row.Blob == nil {
			row.Blob = []byte{}
		}
	}
	return row
}

func (r messageRow) message() cheetah.Message {
	m := cheetah.Message{
		Seq:     r.Seq,
		Kind:    cheetah.MessageKind(r.Kind),
		Name:    r.Name,
		Data:    rawJSON(r.Data),
		Code:    r.Code,
		Message: r.Message,
		Mime:    r.Mime,
		Late:    r.Late,
		At:      r.At.UTC(),
	}
	if m.Kind == cheetah.KindCapture {
		// The API shows a capture's bytes base64 in data, as the client
		// sent them; marshalling a string cannot fail.
		m.Data, _ = json.Marshal(base64.StdEncoding.EncodeToString(r.Blob))
	}
	return m
}

func (r keyRow) key() Key {
	return Key{
		ID:            r.ID,
		Kind:          r.Kind,
		UserID:        deref(r.UserID),
		TenantID:      deref(r.TenantID),
		Name:          r.Name,
		Hash:          r.Hash,
		WebhookSecret: deref(r.WebhookSecret),
		CreatedAt:     r.CreatedAt.UTC(),
		RevokedAt:     readTime(r.RevokedAt),
	}
}

// jsonText stores absent JSON as NULL and present JSON as its exact text.
func jsonText(raw json.RawMessage) *string {
	if len(raw) == 0 {
		return nil
	}
	s := string(raw)
	return &s
}

func rawJSON(s *string) json.RawMessage {
	if s == nil {
		return nil
	}
	return json.RawMessage(*s)
}

// text stores an empty string as NULL.
func text(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func readTime(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

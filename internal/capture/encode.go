package capture

import (
	"database/sql/driver"
	"encoding"
	"encoding/json"
	"fmt"
	"github.com/gorm-outbox/outboxplugin/internal/jsontext"
	"math"
	"reflect"
	"strconv"
	"time"
	"unicode/utf8"
)

// The encoding stage: payloads and headers as JSON text. Captured payloads are written by hand here
// (an object of column values, keys in the order given) so that the same event gives the same text on
// every database, and so that the common column types cost no reflection.

// plainValue dereferences pointers and resolves driver.Valuer values that have no text or JSON form
// of their own (sql.NullString, gorm.DeletedAt), so that payloads carry what the database stores.
func plainValue(v any) any {
	for {
		switch x := v.(type) {
		case nil, string, int, int64, int32, uint, uint64, uint32, bool, float64, []byte, time.Time:
			return v
		case json.Marshaler, encoding.TextMarshaler:
			return v
		case driver.Valuer:
			rv := reflect.ValueOf(x)
			if rv.Kind() == reflect.Pointer && rv.IsNil() {
				return nil
			}
			dv, err := x.Value()
			if err != nil {
				return valuerError{err}
			}
			return dv
		}
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Pointer {
			return v
		}
		if rv.IsNil() {
			return nil
		}
		v = rv.Elem().Interface()
	}
}

type valuerError struct{ err error }

// appendJSONObject appends {"name":value,...}.
func appendJSONObject(b []byte, names []string, values []any) ([]byte, error) {
	b = append(b, '{')
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, name)
		b = append(b, ':')
		var err error
		if b, err = appendJSONValue(b, values[i]); err != nil {
			return nil, fmt.Errorf("column %s: %w", name, err)
		}
	}
	return append(b, '}'), nil
}

// appendJSONValue encodes the common column types directly and hands the rest to encoding/json.
func appendJSONValue(b []byte, v any) ([]byte, error) {
	v = plainValue(v)
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case valuerError:
		return nil, x.err
	case string:
		return appendJSONString(b, x), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(x), 10), nil
	case uint:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint64:
		return strconv.AppendUint(b, x, 10), nil
	case uint32:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case bool:
		return strconv.AppendBool(b, x), nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("unsupported value %v", x)
		}
	case time.Time:
		// In UTC, whatever zone the driver handed the value back in (pgx: the session's, MySQL: the
		// DSN's loc), so that one instant has one text on every database.
		if y := x.Year(); y < 0 || y > 9999 {
			return nil, fmt.Errorf("time %v outside the years 0-9999 of RFC 3339", x)
		}
		b = append(b, '"')
		b = x.UTC().AppendFormat(b, time.RFC3339Nano)
		return append(b, '"'), nil
	}
	enc, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, enc...), nil
}

// appendJSONString writes s as a JSON string. Plain ASCII is copied; anything that needs escaping or
// is not valid UTF-8 goes through encoding/json, which replaces invalid bytes with U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf || c == '<' || c == '>' || c == '&' {
			enc, _ := json.Marshal(s)
			return append(b, enc...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// EncodePayload turns a payload (Emit's, or a customizer's) into JSON text: json.RawMessage and
// []byte are taken as JSON text already, and must be valid; anything else is marshalled.
func EncodePayload(p any) (string, error) {
	switch x := p.(type) {
	case json.RawMessage:
		return validJSON(x)
	case []byte:
		return validJSON(x)
	}
	enc, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrEncodePayload, err)
	}
	return string(enc), nil
}

func validJSON(b []byte) (string, error) {
	if b == nil {
		return "null", nil
	}
	if !jsontext.Valid(b) {
		return "", fmt.Errorf("%w: %w", ErrEncodePayload, ErrInvalidJSON)
	}
	return string(b), nil
}

// EncodeHeaders encodes headers as a JSON object; no headers is SQL NULL (nil).
func EncodeHeaders(h map[string]string) (*string, error) {
	if len(h) == 0 {
		return nil, nil
	}
	enc, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode headers: %w", err)
	}
	s := string(enc)
	return &s, nil
}

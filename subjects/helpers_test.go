package subjects_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/natstone/natstone/subjects"
)

// wantCode fails t unless err is an *subjects.Error (somewhere in its chain) with code want.
func wantCode(t *testing.T, err error, want subjects.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want code %q", want)
	}
	var e *subjects.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *subjects.Error, want code %q", err, err, want)
	}
	if got := subjects.CodeOf(err); got != want {
		t.Fatalf("CodeOf(%v) = %q, want %q", err, got, want)
	}
}

// mustSpace returns NewSpace(prefix) or fails t.
func mustSpace(t testing.TB, prefix string) subjects.Space {
	t.Helper()
	s, err := subjects.NewSpace(prefix)
	if err != nil {
		t.Fatalf("NewSpace(%q): %v", prefix, err)
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// queueAlphabet is every byte ValidateQueueName accepts (64 of them).
const queueAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"

// normalize returns a deep copy of v in which every empty (non-nil) slice or map is nil. encoding/json
// with omitempty cannot tell the two apart, so values compared after a JSON round trip are normalized.
func normalize(v any) any {
	rv := reflect.ValueOf(v)
	out := reflect.New(rv.Type()).Elem()
	normalizeInto(out, rv)
	return out.Interface()
}

func normalizeInto(dst, src reflect.Value) {
	switch src.Kind() {
	case reflect.Pointer:
		if src.IsNil() {
			return
		}
		p := reflect.New(src.Type().Elem())
		normalizeInto(p.Elem(), src.Elem())
		dst.Set(p)
	case reflect.Struct:
		for i := range src.NumField() {
			if !src.Type().Field(i).IsExported() { // e.g. time.Time: copy it whole
				dst.Set(src)
				return
			}
		}
		for i := range src.NumField() {
			normalizeInto(dst.Field(i), src.Field(i))
		}
	case reflect.Slice:
		if src.Len() == 0 {
			return
		}
		s := reflect.MakeSlice(src.Type(), src.Len(), src.Len())
		for i := range src.Len() {
			normalizeInto(s.Index(i), src.Index(i))
		}
		dst.Set(s)
	case reflect.Map:
		if src.Len() == 0 {
			return
		}
		m := reflect.MakeMapWithSize(src.Type(), src.Len())
		iter := src.MapRange()
		for iter.Next() {
			val := reflect.New(src.Type().Elem()).Elem()
			normalizeInto(val, iter.Value())
			m.SetMapIndex(iter.Key(), val)
		}
		dst.Set(m)
	default:
		dst.Set(src)
	}
}

func TestNormalize(t *testing.T) {
	a := subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{{PayloadBase64: []byte{}, Metadata: map[string]string{}}}}
	b := subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{{}}}
	if reflect.DeepEqual(a, b) {
		t.Fatal("precondition: a and b should differ before normalizing")
	}
	if !reflect.DeepEqual(normalize(a), normalize(b)) {
		t.Fatalf("normalize(a) = %#v, normalize(b) = %#v", normalize(a), normalize(b))
	}
	c := subjects.EnqueueRequest{Priority: ptr(int64(0)), Metadata: map[string]string{"k": ""}, PayloadBase64: []byte{0}}
	if !reflect.DeepEqual(normalize(c), c) {
		t.Fatalf("normalize changed a value without empty containers: %#v", normalize(c))
	}
	if strings.Count(queueAlphabet, "") != 65 {
		t.Fatalf("queueAlphabet has %d bytes, want 64", len(queueAlphabet))
	}
}

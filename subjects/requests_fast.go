package subjects

// DecodeDequeue decodes a dequeue body, as Decode would. Every cycle of a worker sends one, so a
// flat body of plain strings and integers (see DecodeEnqueue) is read here in one pass without
// reflection or a json.Decoder; a filter, or anything else, goes to Decode. FuzzDecodeRequests
// checks that both agree.
func DecodeDequeue(data []byte) (DequeueRequest, error) {
	if r, ok := fastDequeue(data); ok {
		return r, nil
	}
	var r DequeueRequest // apart from the fast path's: Decode's argument escapes
	err := Decode(data, &r)
	return r, err
}

// DecodeLease decodes the body of complete or cancel, as Decode would; see DecodeDequeue. A next
// of plain fields (no filter) stays on the fast path.
func DecodeLease(data []byte) (LeaseRequest, error) {
	if r, ok := fastLease(data); ok {
		return r, nil
	}
	var r LeaseRequest
	err := Decode(data, &r)
	return r, err
}

func fastDequeue(data []byte) (DequeueRequest, bool) {
	o := flatObject{data: data}
	r := o.dequeue()
	return r, o.ok
}

// dequeue reads the object as a DequeueRequest.
func (o *flatObject) dequeue() (r DequeueRequest) {
	for o.next() {
		switch string(o.key) {
		case "batch":
			batch := o.int(0)
			if r.Batch = int(batch); int64(r.Batch) != batch {
				o.ok = false
			}
		case "lease_ms":
			r.LeaseMS = o.int(1)
		case "wait_ms":
			r.WaitMS = o.int(2)
		case "request_id":
			r.RequestID = o.str(3)
		case "worker":
			r.Worker = o.str(4)
		default:
			o.ok = false
		}
	}
	return r
}

func fastLease(data []byte) (r LeaseRequest, ok bool) {
	o := flatObject{data: data}
	for o.next() {
		switch string(o.key) {
		case "id":
			r.ID = o.str(0)
		case "lease_id":
			r.LeaseID = o.str(1)
		case "next":
			r.Next = o.object(2)
		default:
			return r, false
		}
	}
	return r, o.ok
}

// flatObject reads data as one JSON object of plain keys and values, with white space around it
// and nothing after it (unless inner: then it is a value within data, from p on). next moves to
// each key in turn; the caller reads its value with int, str or object, which give it a field
// number (below 8). After the last key ok says whether the whole object was read: a value that is
// not plain, a field seen twice (encoding/json keeps the last; Decode is left to do that) or
// anything unexpected makes it false.
type flatObject struct {
	data    []byte
	p       int
	key     []byte // the current key, unescaped: a slice of data
	seen    uint8
	started bool
	inner   bool // an object within another: it ends at its closing brace
	ok      bool // the object so far is as expected; after the last next, read whole
}

// next moves to the next key, and reports false at the end of the object or on anything the fast
// path leaves to Decode (then ok is false).
func (o *flatObject) next() bool {
	d := o.data
	if !o.started {
		o.started = true
		o.p, o.ok = expect(d, skip(d, o.p), '{')
		if !o.ok {
			return false
		}
		if o.p = skip(d, o.p); o.p < len(d) && d[o.p] == '}' {
			o.p++
			o.ok = o.inner || skip(d, o.p) == len(d)
			return false
		}
	} else {
		if !o.ok {
			return false
		}
		o.p = skip(d, o.p)
		if o.p < len(d) && d[o.p] == ',' {
			o.p = skip(d, o.p+1)
		} else {
			o.p, o.ok = expect(d, o.p, '}')
			o.ok = o.ok && (o.inner || skip(d, o.p) == len(d))
			return false
		}
	}
	if o.key, o.p, o.ok = plainBytes(d, o.p); !o.ok {
		return false
	}
	if o.p, o.ok = expect(d, skip(d, o.p), ':'); !o.ok {
		return false
	}
	o.p = skip(d, o.p)
	return true
}

// field marks field n seen, and reports false if it was already.
func (o *flatObject) field(n int) bool {
	if o.seen&(1<<n) != 0 {
		o.ok = false
		return false
	}
	o.seen |= 1 << n
	return true
}

// int reads the current value, field n, as a plain integer (see plainInt64).
func (o *flatObject) int(n int) int64 {
	if !o.field(n) {
		return 0
	}
	var v int64
	v, o.p, o.ok = plainInt64(o.data, o.p)
	return v
}

// str reads the current value, field n, as a plain string (see plainString).
func (o *flatObject) str(n int) string {
	if !o.field(n) {
		return ""
	}
	var s string
	s, o.p, o.ok = plainString(o.data, o.p)
	return s
}

// object reads the current value, field n, as a flat dequeue request (the next of a lease
// operation's body).
func (o *flatObject) object(n int) *DequeueRequest {
	if !o.field(n) {
		return nil
	}
	in := flatObject{data: o.data, p: o.p, inner: true}
	r := in.dequeue()
	o.p, o.ok = in.p, in.ok
	return &r
}

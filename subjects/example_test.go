package subjects_test

import (
	"errors"
	"fmt"

	"github.com/natstone/natstone/subjects"
)

func ExampleSpace_Subject() {
	s, err := subjects.NewSpace("") // the default prefix, natstone.v1
	if err != nil {
		panic(err)
	}
	fmt.Println(s.Subject(subjects.OpEnqueue, "encode"))
	fmt.Println(s.Subject(subjects.OpList, ""))
	fmt.Println(s.Wildcard(subjects.OpDequeue))

	custom, err := subjects.NewSpace("acme.prod.natstone")
	if err != nil {
		panic(err)
	}
	fmt.Println(custom.Subject(subjects.OpEnqueueBatch, "thumbnails"))
	// Output:
	// natstone.v1.enqueue.encode
	// natstone.v1.list
	// natstone.v1.dequeue.*
	// acme.prod.natstone.enqueue_batch.thumbnails
}

func ExampleSpace_Parse() {
	s, err := subjects.NewSpace(subjects.DefaultPrefix)
	if err != nil {
		panic(err)
	}
	for _, subject := range []string{
		"natstone.v1.complete.encode",
		"natstone.v1.list",
		"natstone.v1.push.encode",
		"natstone.v1.enqueue.bad.name",
		"other.v1.enqueue.encode",
	} {
		op, queue, err := s.Parse(subject)
		if err != nil {
			fmt.Printf("%s: %s\n", subject, subjects.CodeOf(err))
			continue
		}
		fmt.Printf("%s: op=%s queue=%q\n", subject, op, queue)
	}
	// Output:
	// natstone.v1.complete.encode: op=complete queue="encode"
	// natstone.v1.list: op=list queue=""
	// natstone.v1.push.encode: bad_request
	// natstone.v1.enqueue.bad.name: invalid_queue_name
	// other.v1.enqueue.encode: bad_request
}

func ExampleCodeOf() {
	err := fmt.Errorf("complete m1: %w", subjects.Errorf(subjects.CodeLeaseExpired, "lease %s expired", "L1"))
	fmt.Println(subjects.CodeOf(err), subjects.CodeOf(err).Status())
	fmt.Println(errors.Is(err, &subjects.Error{Code: subjects.CodeLeaseExpired}))
	fmt.Println(subjects.CodeOf(errors.New("not a protocol error")))
	// Output:
	// lease_expired 409
	// true
	// internal
}

// Package clock abstracts time so that natstone's lease, invisibility and
// garbage-collection logic can be tested without sleeping.
//
// Production code receives a [Clock] (normally [Real]) and must never call
// time.Now or time.AfterFunc directly. Tests inject a [Fake], whose time only
// moves when the test calls [Fake.Advance] or [Fake.Set]. A Fake runs due
// callbacks synchronously inside Advance, so when Advance returns every
// callback that became due has already finished; tests are therefore
// deterministic. [Fake.WaitForTimers] lets a test wait, without sleeping,
// until the code under test has armed its timers before advancing.
package clock

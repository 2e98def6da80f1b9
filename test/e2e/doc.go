// Package e2e holds end-to-end tests of natstone as users meet it: the requests its documentation
// shows, run against a real broker on an in-process JetStream server, and the server configuration
// docs/security.md gives, loaded as written.
package e2e

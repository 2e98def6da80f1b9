package workers

import "time"

// SetPollRetry sets how long w's slots wait to poll again after a run of failures polls in a row
// that failed, the last with err (pollRetry by default). Call it before Start.
func SetPollRetry(w *Worker, f func(failures int, err error) time.Duration) { w.pollRetryFunc = f }

package gateway

// Metrics observes the gateway, per server and tool. Implementations
// must be safe for concurrent use.
type Metrics interface {
	// Call counts a tools/call an agent made.
	Call(server, tool string)
	// Execution counts a coalesced call run on the server.
	Execution(server, tool string)
	// Served counts a coalesced call answered, by where from (l1, l2,
	// upstream: its own execution or another's).
	Served(server, tool, source string)
	// Retry counts a call run again after its connection was lost.
	Retry(server string)
	// Processes adds delta to the server's live processes or sessions.
	Processes(server string, delta int)
	// Restart counts a process or session started again after it ended.
	Restart(server string)
}

type nopMetrics struct{}

func (nopMetrics) Call(string, string)           {}
func (nopMetrics) Execution(string, string)      {}
func (nopMetrics) Served(string, string, string) {}
func (nopMetrics) Retry(string)                  {}
func (nopMetrics) Processes(string, int)         {}
func (nopMetrics) Restart(string)                {}

type metrics struct{ Metrics }

func orNop(m Metrics) metrics {
	if m == nil {
		return metrics{nopMetrics{}}
	}
	return metrics{m}
}

func (m metrics) call(s, t string)        { m.Call(s, t) }
func (m metrics) execution(s, t string)   { m.Execution(s, t) }
func (m metrics) served(s, t, src string) { m.Served(s, t, src) }
func (m metrics) retry(s string)          { m.Retry(s) }
func (m metrics) process(s string, d int) { m.Processes(s, d) }
func (m metrics) restart(s string)        { m.Restart(s) }

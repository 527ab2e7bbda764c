package gateway

// Metrics observes the gateway, per server and tool. The method names
// carry MCP so that one registry can implement this and
// coordinator.Metrics. A tool label is the tool's name for a tool the
// operator allows to coalesce, and "other" for the rest (agents choose
// names; the labels stay bounded). Implementations must be safe for
// concurrent use.
type Metrics interface {
	// MCPCall counts a tools/call an agent made.
	MCPCall(server, tool string)
	// MCPExecution counts a coalesced call run on the server: the calls
	// of a tool less its executions are the calls coalesced or cached.
	MCPExecution(server, tool string)
	// MCPServed counts a coalesced call answered, by where from: l1, l2
	// (cached, or another instance's execution), upstream (an execution
	// of this instance's flight).
	MCPServed(server, tool, source string)
	// MCPRetry counts a call run again after its connection was lost.
	MCPRetry(server string)
	// MCPProcesses adds delta to the server's live processes (remote
	// sessions for a remote server).
	MCPProcesses(server string, delta int)
	// MCPRestart counts a process or session started again after it ended.
	MCPRestart(server string)
	// MCPAbandoned counts a coalesced execution cancelled on the server
	// because no caller was left on any instance.
	MCPAbandoned(server, tool string)
}

type nopMetrics struct{}

func (nopMetrics) MCPCall(string, string)           {}
func (nopMetrics) MCPExecution(string, string)      {}
func (nopMetrics) MCPServed(string, string, string) {}
func (nopMetrics) MCPRetry(string)                  {}
func (nopMetrics) MCPProcesses(string, int)         {}
func (nopMetrics) MCPRestart(string)                {}
func (nopMetrics) MCPAbandoned(string, string)      {}

type metrics struct{ m Metrics }

func orNop(m Metrics) metrics {
	if m == nil {
		return metrics{nopMetrics{}}
	}
	return metrics{m}
}

func (m metrics) call(s, t string)        { m.m.MCPCall(s, t) }
func (m metrics) execution(s, t string)   { m.m.MCPExecution(s, t) }
func (m metrics) served(s, t, src string) { m.m.MCPServed(s, t, src) }
func (m metrics) retry(s string)          { m.m.MCPRetry(s) }
func (m metrics) process(s string, d int) { m.m.MCPProcesses(s, d) }
func (m metrics) restart(s string)        { m.m.MCPRestart(s) }
func (m metrics) abandoned(s, t string)   { m.m.MCPAbandoned(s, t) }

package egresspolicy

// Egress modes of [agents.egress] mode: read-only is judged in readonly.go.
const (
	ModeReadWrite = ""
	ModeReadOnly  = "read-only"
)

package isolation

// What a run's egress record keeps. A tool can make any number of requests:
// the record keeps the first and the last of them and every refusal up to a
// bound, and counts all of them by host, so a flood of allowed requests
// cannot push the interesting ones out.
const (
	// EgressFirstKept and EgressLastKept are the decisions kept from the
	// start and the end of a run.
	EgressFirstKept = 50
	EgressLastKept  = 50
	// EgressRefusalsKept bounds the refusals kept between them.
	EgressRefusalsKept = 200
	// EgressHostsCounted bounds the hosts counted one by one; the
	// requests to any further host are counted together.
	EgressHostsCounted = 64
)

// EgressCounts are a run's egress decisions counted: every one of them,
// including those the record does not keep.
type EgressCounts struct {
	Allowed int `json:"allowed"`
	Refused int `json:"refused"`
	// Hosts are the first EgressHostsCounted hosts, most requests first;
	// OtherHosts counts the requests to the hosts after them.
	Hosts      []EgressHostCount `json:"hosts,omitempty"`
	OtherHosts EgressHostCount   `json:"other_hosts"`
	// BytesUp and BytesDown add up every decision's bytes (metrics).
	BytesUp   int64 `json:"bytes_up,omitempty"`
	BytesDown int64 `json:"bytes_down,omitempty"`
}

// EgressHostCount is how many requests to one host were allowed and refused.
type EgressHostCount struct {
	Host    string `json:"host,omitempty"`
	Allowed int    `json:"allowed"`
	Refused int    `json:"refused"`
}

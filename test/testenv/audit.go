package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// PodRequest is one request of kube-apiserver's audit log (Options.AuditLog,
// AuditLogPath): a pod create or delete, or an eviction (Subresource
// "eviction"), as answered.
type PodRequest struct {
	Verb, Subresource string
	Namespace, Pod    string
	User              string
	Code              int       // the response's HTTP status (201 an accepted eviction, 429 one a budget refused)
	At                time.Time // when the answer was complete (the API server's clock)
}

// auditEvent is the part of an audit.k8s.io/v1 Event read here.
type auditEvent struct {
	Stage string `json:"stage"`
	Verb  string `json:"verb"`
	User  struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	StageTimestamp time.Time `json:"stageTimestamp"`
}

// PodRequests reads the audit log at path: every completed pod request of
// namespace ns, in the order the API server answered them.
func PodRequests(path, ns string) ([]PodRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("testenv: audit log: %w", err)
	}
	defer f.Close()
	var reqs []PodRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(`"pods"`)) {
			continue
		}
		var a auditEvent
		if err := json.Unmarshal(line, &a); err != nil {
			return nil, fmt.Errorf("testenv: audit log line %q: %w", line, err)
		}
		r := a.ObjectRef
		if a.Stage != "ResponseComplete" || r == nil || r.Resource != "pods" || r.Namespace != ns {
			continue
		}
		req := PodRequest{Verb: a.Verb, Subresource: r.Subresource, Namespace: r.Namespace, Pod: r.Name, User: a.User.Username, At: a.StageTimestamp}
		if a.ResponseStatus != nil {
			req.Code = a.ResponseStatus.Code
		}
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("testenv: audit log: %w", err)
	}
	return reqs, nil
}

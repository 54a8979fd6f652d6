package v2

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Node is an etcd v2 node, with the JSON field names and omissions of
// etcd's v2 store (server/etcdserver/api/v2store.NodeExtern).
type Node struct {
	Key           string  `json:"key,omitempty"`
	Value         *string `json:"value,omitempty"`
	Dir           bool    `json:"dir,omitempty"`
	Nodes         []*Node `json:"nodes,omitempty"`
	ModifiedIndex int64   `json:"modifiedIndex,omitempty"`
	CreatedIndex  int64   `json:"createdIndex,omitempty"`
}

// Event is an etcd v2 keys API response body: the action and the node,
// with the previous node for writes that replaced one.
type Event struct {
	Action   string `json:"action"`
	Node     *Node  `json:"node,omitempty"`
	PrevNode *Node  `json:"prevNode,omitempty"`
}

// Error is an etcd v2 error body (server/etcdserver/api/v2error).
type Error struct {
	ErrorCode int    `json:"errorCode"`
	Message   string `json:"message"`
	Cause     string `json:"cause,omitempty"`
	Index     int64  `json:"index"`
}

// The etcd v2 error codes this service returns, with etcd's messages and
// HTTP statuses.
const (
	EcodeKeyNotFound       = 100
	EcodeNotFile           = 102
	EcodeNoMorePeer        = 103
	EcodeNodeExist         = 105
	EcodeKeyIsPreserved    = 106
	EcodeIndexNaN          = 203
	EcodeInvalidField      = 209
	EcodeRaftInternal      = 300
	EcodeEventIndexCleared = 401
)

var errorMessages = map[int]string{
	EcodeKeyNotFound:       "Key not found",
	EcodeNotFile:           "Not a file",
	EcodeNoMorePeer:        "Reached the max number of peers in the cluster",
	EcodeNodeExist:         "Key already exists",
	EcodeKeyIsPreserved:    "The prefix of given key is a keyword in etcd",
	EcodeIndexNaN:          "The given index in POST form is not a number",
	EcodeInvalidField:      "Invalid field",
	EcodeRaftInternal:      "Raft Internal Error",
	EcodeEventIndexCleared: "The event in requested index is outdated and cleared",
}

func errorStatus(code int) int {
	switch code {
	case EcodeKeyNotFound:
		return http.StatusNotFound
	case EcodeNotFile:
		return http.StatusForbidden
	case EcodeNodeExist:
		return http.StatusPreconditionFailed
	case EcodeRaftInternal:
		return http.StatusInternalServerError
	}
	return http.StatusBadRequest
}

func newError(code int, cause string, index int64) *Error {
	return &Error{ErrorCode: code, Message: errorMessages[code], Cause: cause, Index: index}
}

func (e *Error) Error() string { return e.Message + " (" + e.Cause + ")" }

// write sends the error as etcd does: X-Etcd-Index, JSON, a newline.
func (e *Error) write(w http.ResponseWriter) { e.writeStatus(w, errorStatus(e.ErrorCode)) }

// writeStatus is write with another status than the code's usual one.
func (e *Error) writeStatus(w http.ResponseWriter, status int) {
	w.Header().Set("X-Etcd-Index", strconv.FormatInt(e.Index, 10))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(e)
	_, _ = w.Write(append(b, '\n'))
}

// writeEvent sends a keys API answer as etcd does.
func writeEvent(w http.ResponseWriter, status int, index int64, ev *Event) {
	w.Header().Set("X-Etcd-Index", strconv.FormatInt(index, 10))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(ev)
	_, _ = w.Write(append(b, '\n'))
}

func strPtr(s string) *string { return &s }

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// JSON-RPC 2.0 error codes.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeMethodNotFound = -32601
)

// sdkMethods are the methods the go-sdk's server receives (mcp/server.go's
// serverMethodInfos, v1.8.0); for any other, the SDK answers a plain-text
// HTTP 400 instead of a JSON-RPC error, so checkJSONRPC answers it first.
var sdkMethods = map[string]bool{
	"completion/complete": true, "server/discover": true, "initialize": true, "ping": true,
	"prompts/list": true, "prompts/get": true, "tools/list": true, "tools/call": true,
	"resources/list": true, "resources/templates/list": true, "resources/read": true,
	"logging/setLevel": true, "resources/subscribe": true, "subscriptions/listen": true,
	"resources/unsubscribe": true, "notifications/cancelled": true, "notifications/initialized": true,
	"notifications/roots/list_changed": true, "notifications/progress": true,
}

// rpcVerdict is what checkMessage decided about a POST body: pass it on to
// the SDK (status 0), or answer status with a JSON-RPC error (code not 0),
// or with no body at all.
type rpcVerdict struct {
	status  int
	id      any // the request's id, or nil: the answer then has none
	code    int
	message string
}

// The refusals of checkMessage; the TypeScript server's checkMessage gives
// the same, word for word.
var (
	errNotJSON   = rpcVerdict{status: http.StatusBadRequest, code: codeParseError, message: "Parse error: the body is not JSON"}
	errBatch     = rpcVerdict{status: http.StatusBadRequest, code: codeInvalidRequest, message: "Invalid Request: JSON-RPC batches are not supported (MCP 2025-06-18 removed them); send one message per request"}
	errNotRPC    = rpcVerdict{status: http.StatusBadRequest, code: codeInvalidRequest, message: "Invalid Request: not a JSON-RPC 2.0 message"}
	errBadID     = rpcVerdict{status: http.StatusBadRequest, code: codeInvalidRequest, message: "Invalid Request: id must be a string or an integer between -(2^53-1) and 2^53-1"}
	errBadMethod = rpcVerdict{status: http.StatusBadRequest, code: codeInvalidRequest, message: "Invalid Request: method must be a string"}
)

// checkMessage decides what to do with a POST body, as MCP (2025-06-18 and
// later) and JSON-RPC 2.0 say: a body that is not JSON is a parse error;
// a batch (a JSON array), a message without jsonrpc "2.0", an id that is
// neither a string nor an integer that every peer can echo exactly (a
// JavaScript safe integer: 1e308, 1.5 and null are refused), or a method
// that is not a string is an invalid request, answered 400 with an error
// that has no id. A request for a method the SDK does not serve is
// answered -32601 with its id (HTTP 200); a notification of one, 202.
func checkMessage(body []byte) rpcVerdict {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return errNotJSON
	}
	if _, err := d.Token(); err != io.EOF {
		return errNotJSON
	}
	if _, ok := v.([]any); ok {
		return errBatch
	}
	msg, ok := v.(map[string]any)
	if !ok || msg["jsonrpc"] != "2.0" {
		return errNotRPC
	}
	id, hasID := msg["id"]
	if hasID && !validID(id) {
		return errBadID
	}
	m, hasMethod := msg["method"]
	if !hasMethod {
		if _, isResult := msg["result"]; !isResult && msg["error"] == nil {
			return errNotRPC
		}
		return rpcVerdict{} // a response: the SDK's to take
	}
	method, ok := m.(string)
	switch {
	case !ok:
		return errBadMethod
	case sdkMethods[method]:
		return rpcVerdict{}
	case !hasID:
		return rpcVerdict{status: http.StatusAccepted}
	}
	return rpcVerdict{status: http.StatusOK, id: id, code: codeMethodNotFound, message: "Method not found"}
}

// validID reports whether id is a string or an integer of magnitude at
// most 2^53-1, such as JavaScript peers read exactly.
func validID(id any) bool {
	switch id := id.(type) {
	case string:
		return true
	case json.Number:
		f, err := strconv.ParseFloat(string(id), 64)
		return err == nil && f == math.Trunc(f) && math.Abs(f) <= 1<<53-1
	}
	return false
}

// checkJSONRPC answers a POST whose body checkMessage refuses, and passes
// the rest on to next with the body it read, bounded as the SDK bounds it.
func checkJSONRPC(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, mcp.DefaultMaxRequestBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				http.Error(w, fmt.Sprintf("request body exceeds %d bytes", mbe.Limit), http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "failed to read body", http.StatusBadRequest)
			return
		}
		v := checkMessage(body)
		if v.status == 0 {
			r.Body = io.NopCloser(bytes.NewReader(body))
			next.ServeHTTP(w, r)
			return
		}
		writeRPCError(w, v)
	})
}

// writeRPCError writes v's status and, if it has a code, its JSON-RPC
// error.
func writeRPCError(w http.ResponseWriter, v rpcVerdict) {
	if v.code == 0 {
		w.WriteHeader(v.status)
		return
	}
	type rpcError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		JSONRPC string   `json:"jsonrpc"`
		ID      any      `json:"id,omitempty"`
		Error   rpcError `json:"error"`
	}{"2.0", v.id, rpcError{v.code, v.message}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(v.status)
	w.Write(b)
}

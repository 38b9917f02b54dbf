package rebuild

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/projector-dev/projector/internal/jsonbody"

	"go.yaml.in/yaml/v3"

	"github.com/projector-dev/projector/projection"
)

// maxBody bounds a request body of the admin API.
const maxBody = 1 << 20

// Codes the admin API answers besides the operations' own.
const (
	codeNotFound   = "not_found"
	codeBadRequest = "bad_request"
	codeInternal   = "internal"
)

// StartBody is the body of POST /admin/v1/projections/{name}/rebuilds;
// every field is optional.
type StartBody struct {
	// Definition is one projection as an entry of the projection file
	// has it (name, topic, table, key, mode, columns, events, ...);
	// absent: the live generation's.
	Definition json.RawMessage `json:"definition"`
	// ReaderSchema is the Avro reader schema (JSON text) of the new
	// definition; empty: the latest registered for the topic.
	ReaderSchema        string `json:"reader_schema"`
	AllowPartialHistory bool   `json:"allow_partial_history"`
	// Retain is how long the generation it replaces is kept for a
	// rollback, as a Go duration (24h).
	Retain string `json:"retain"`
	Actor  string `json:"actor"`
}

// actionBody is the optional body of a rollback and of a cancel.
type actionBody struct {
	Actor string `json:"actor"`
}

// Handler serves the admin API of identity's rebuild operations under
// /admin/v1/. It has no authentication of its own.
func Handler(store *Store, identity string, log *slog.Logger) http.Handler {
	return NewHandler(store, identity, log, HandlerOptions{})
}

// HandlerOptions adapt the rebuild routes to an API that authenticates
// its requests.
type HandlerOptions struct {
	// Actor, when set, is who asks, for the operation's record: the
	// authenticated subject. An actor in a body or query is then refused,
	// since free text is not who asked.
	Actor func(*http.Request) string
	// WriteError, when set, answers every error, in the shape of the API
	// the routes are served in.
	WriteError func(w http.ResponseWriter, status int, code, message string)
}

// NewHandler is Handler with opts.
func NewHandler(store *Store, identity string, log *slog.Logger, opts HandlerOptions) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.WriteError == nil {
		opts.WriteError = writeError
	}
	a := &api{store: store, identity: identity, log: log, opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /admin/v1/projections/{name}/rebuilds", a.start)
	mux.HandleFunc("POST /admin/v1/projections/{name}/rollbacks", a.rollback)
	mux.HandleFunc("GET /admin/v1/operations", a.list)
	mux.HandleFunc("GET /admin/v1/operations/{id}", a.get)
	mux.HandleFunc("DELETE /admin/v1/operations/{id}", a.cancel)
	mux.HandleFunc("/admin/", func(w http.ResponseWriter, r *http.Request) {
		a.opts.WriteError(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("no admin API resource %s %s", r.Method, r.URL.Path))
	})
	return mux
}

type api struct {
	store    *Store
	identity string
	log      *slog.Logger
	opts     HandlerOptions
}

// actor is who asks r: the authenticated subject when the API has one,
// else the actor given (given, a 400 when the API has a subject). It
// answers the error itself and reports whether to go on.
func (a *api) actor(w http.ResponseWriter, r *http.Request, given string) (string, bool) {
	if a.opts.Actor == nil {
		return given, true
	}
	if given != "" {
		a.opts.WriteError(w, http.StatusBadRequest, codeBadRequest, "actor: the actor is the authenticated subject; do not send one")
		return "", false
	}
	return a.opts.Actor(r), true
}

func (a *api) start(w http.ResponseWriter, r *http.Request) {
	var body StartBody
	if !decodeBody(w, r, &body, a.opts.WriteError) {
		return
	}
	actor, ok := a.actor(w, r, body.Actor)
	if !ok {
		return
	}
	req := Request{Identity: a.identity, Projection: r.PathValue("name"), AllowPartialHistory: body.AllowPartialHistory, Actor: actor}
	if body.Retain != "" {
		d, err := time.ParseDuration(body.Retain)
		if err != nil || d <= 0 {
			a.opts.WriteError(w, http.StatusBadRequest, codeBadRequest, fmt.Sprintf("retain %q: want a positive duration such as 24h", body.Retain))
			return
		}
		req.Retain = d
	}
	if len(bytes.TrimSpace(body.Definition)) > 0 && !bytes.Equal(bytes.TrimSpace(body.Definition), []byte("null")) {
		def, err := ParseDefinition(body.Definition, body.ReaderSchema)
		if err != nil {
			a.opts.WriteError(w, http.StatusBadRequest, CodeBadDefinition, err.Error())
			return
		}
		req.Definition = &def
	} else if body.ReaderSchema != "" {
		a.opts.WriteError(w, http.StatusBadRequest, codeBadRequest, "reader_schema is given without a definition: send the definition it reads with")
		return
	}
	op, err := a.store.Start(r.Context(), req)
	a.accepted(w, r, op, err)
}

func (a *api) rollback(w http.ResponseWriter, r *http.Request) {
	var body actionBody
	if !decodeBody(w, r, &body, a.opts.WriteError) {
		return
	}
	actor, ok := a.actor(w, r, body.Actor)
	if !ok {
		return
	}
	op, err := a.store.Rollback(r.Context(), a.identity, r.PathValue("name"), actor)
	a.accepted(w, r, op, err)
}

// accepted answers a start: 202 with the operation and where to follow
// it, or the error.
func (a *api) accepted(w http.ResponseWriter, r *http.Request, op Operation, err error) {
	if err != nil {
		a.fail(w, r, err)
		return
	}
	w.Header().Set("Location", "/admin/v1/operations/"+op.ID)
	writeJSON(w, http.StatusAccepted, op)
}

func (a *api) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	op, ok, err := a.store.Operation(r.Context(), id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if !ok || op.Identity != a.identity {
		a.opts.WriteError(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("no operation %s", id))
		return
	}
	writeJSON(w, http.StatusOK, op)
}

func (a *api) list(w http.ResponseWriter, r *http.Request) {
	ops, err := a.store.Operations(r.Context(), a.identity, false)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if ops == nil {
		ops = []Operation{}
	}
	writeJSON(w, http.StatusOK, map[string][]Operation{"operations": ops})
}

func (a *api) cancel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	// Another identity's operation is not this API's to cancel.
	op, ok, err := a.store.Operation(r.Context(), id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if !ok || op.Identity != a.identity {
		a.opts.WriteError(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("no operation %s", id))
		return
	}
	actor, ok := a.actor(w, r, r.URL.Query().Get("actor"))
	if !ok {
		return
	}
	op, err = a.store.Cancel(r.Context(), id, nonEmpty(actor, "the admin API"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, op)
}

// fail answers err: an *Error by its code, anything else as a 500 whose
// detail only the log has.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	var e *Error
	if !errors.As(err, &e) {
		a.log.Error("admin API: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		a.opts.WriteError(w, http.StatusInternalServerError, codeInternal, "the request failed; the replica's log has the detail")
		return
	}
	a.opts.WriteError(w, statusOf(e.Code), e.Code, e.Message)
}

// statusOf is the HTTP status of an error code.
func statusOf(code string) int {
	switch code {
	case CodeInFlight, CodeNothingRetired, CodeCutoverLost, "already_ended":
		return http.StatusConflict
	case CodeUnknown, codeNotFound:
		return http.StatusNotFound
	case CodeBadDefinition, CodeTableTooLong:
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// decodeBody reads r's JSON body into v, refusing unknown fields and
// bodies over maxBody; an empty body leaves v as it is. It answers the
// error itself and reports whether to go on.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, writeErr func(http.ResponseWriter, int, string, string)) bool {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeErr(w, http.StatusRequestEntityTooLarge, codeBadRequest, fmt.Sprintf("the body is larger than %d bytes", maxBody))
			return false
		}
		writeErr(w, http.StatusBadRequest, codeBadRequest, fmt.Sprintf("read the body: %v", err))
		return false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeErr(w, http.StatusBadRequest, codeBadRequest, "the body: "+jsonbody.DecodeError(err))
		return false
	}
	if dec.More() {
		writeErr(w, http.StatusBadRequest, codeBadRequest, "the body: want one JSON object, found more after it")
		return false
	}
	return true
}

// ParseDefinition turns one projection as JSON (an entry of the
// projection file's projections list) and its reader schema into a
// definition, refusing one that does not compile. A schema path is
// refused: the server reads no files, the reader schema comes as text.
func ParseDefinition(def json.RawMessage, readerSchema string) (projection.Definition, error) {
	var node yaml.Node
	// JSON is YAML; decoding to a node keeps the columns in their order.
	if err := yaml.Unmarshal(def, &node); err != nil || len(node.Content) != 1 || node.Content[0].Kind != yaml.MappingNode {
		return projection.Definition{}, errors.New("definition: want a JSON object, one projection as an entry of the projection file has it")
	}
	m := node.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "schema" {
			return projection.Definition{}, errors.New("definition: schema names a file, which the server does not read: send the reader schema's text as reader_schema")
		}
	}
	b, err := yaml.Marshal(map[string]any{"projections": []*yaml.Node{m}})
	if err != nil {
		return projection.Definition{}, fmt.Errorf("definition: %w", err)
	}
	ps, err := projection.Parse(b, "")
	if err != nil {
		return projection.Definition{}, fmt.Errorf("definition: %w", err)
	}
	if len(ps) != 1 {
		return projection.Definition{}, fmt.Errorf("definition: want one projection, found %d", len(ps))
	}
	d, err := ps[0].Definition()
	if err != nil {
		return projection.Definition{}, fmt.Errorf("definition: %w", err)
	}
	if readerSchema != "" {
		if !json.Valid([]byte(readerSchema)) {
			return projection.Definition{}, errors.New("reader_schema: not JSON; want the Avro schema's JSON text")
		}
		d.Schema = readerSchema
	}
	return d, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]*Error{"error": {Code: code, Message: message}})
}

// errorJSON is an Error's JSON form, the same in an operation and in an
// answer of the admin API.
type errorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// MarshalJSON writes e as {"code": ..., "message": ...}.
func (e *Error) MarshalJSON() ([]byte, error) {
	return json.Marshal(errorJSON{Code: e.Code, Message: e.Message})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (e *Error) UnmarshalJSON(b []byte) error {
	var j errorJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	e.Code, e.Message = j.Code, j.Message
	return nil
}

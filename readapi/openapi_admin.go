package readapi

import "strconv"

// adminProblemCodes are the codes the admin API answers besides the read
// API's: its own and those of rebuild operations. They are spelled here,
// not imported, because the packages that define them import this one;
// the admin API's contract test holds the two lists together.
var adminProblemCodes = []string{
	"bad_request", "body_too_large", "not_served",
	"rebuild_in_flight", "history_deleted", "unknown_projection", "nothing_to_roll_back",
	"cutover_won", "bad_definition", "table_name_too_long", "generation_gone", "already_ended",
}

// adminSecurity is the admin routes' requirement: a bearer token with
// scope admin (OpenAPI 3.1 lets a non-OAuth scheme name the roles it
// needs).
var adminSecurity = []any{obj{"bearer": []string{"admin"}}}

// adminErrors are the problem responses every admin route may answer.
func adminErrors(statuses ...int) obj {
	out := obj{"401": problemRef(401), "403": problemRef(403), "500": problemRef(500), "503": problemRef(503)}
	for _, s := range statuses {
		out[strconv.Itoa(s)] = problemRef(s)
	}
	return out
}

func jsonBody(schema obj) obj {
	return obj{"application/json": obj{"schema": schema}}
}

// jsonResponse is a JSON answer that must not be cached.
func jsonResponse(description string, schema obj) obj {
	return obj{
		"description": description,
		"headers":     obj{"Cache-Control": obj{"schema": obj{"type": "string", "const": "no-store"}}},
		"content":     jsonBody(schema),
	}
}

func adminOp(id, summary string, params []any, body obj, responses obj) obj {
	op := obj{"operationId": id, "summary": summary, "tags": []string{"admin"}, "security": adminSecurity, "responses": responses}
	if len(params) > 0 {
		op["parameters"] = params
	}
	if body != nil {
		op["requestBody"] = body
	}
	return op
}

func merge(a, b obj) obj {
	for k, v := range b {
		a[k] = v
	}
	return a
}

// addAdmin adds the admin API's paths and schemas (docs/api.md, "Admin
// API") to a document's.
func addAdmin(paths, schemas obj) {
	str := obj{"type": "string"}
	i64 := obj{"type": "integer"}
	nullable := func(t string) obj { return obj{"type": []string{t, "null"}} }
	when := obj{"type": "string", "description": "An RFC 3339 time, or how long ago: a duration such as 24h, or whole days such as 7d."}
	filterProps := obj{
		"identity": str, "projection": str, "topic": str, "key": str, "error_class": str,
		"status": obj{"type": "string", "description": "The entry's state, e.g. open, queued, resolved."},
		"since":  when, "until": when,
	}
	schemas["DeadLetterFilter"] = obj{"type": "object", "additionalProperties": false, "properties": filterProps}
	schemas["DeadLetter"] = obj{
		"type":     "object",
		"required": []string{"id", "identity", "projection", "topic", "partition", "offset", "key", "error", "error_class", "status", "attempts", "replays", "first_seen", "last_seen"},
		"properties": obj{
			"id": i64, "identity": str, "projection": str, "topic": str,
			"partition": i64, "offset": i64, "key": str, "key_null": obj{"type": "boolean"},
			"value":       obj{"type": []string{"string", "null"}, "contentEncoding": "base64"},
			"headers":     obj{"type": []string{"array", "null"}, "items": obj{"type": "object"}},
			"record_time": obj{"type": "string", "format": "date-time"},
			"error":       str, "error_class": str, "schema_id": i64, "trace_id": str, "status": str,
			"attempts": i64, "replays": i64,
			"first_seen":  obj{"type": "string", "format": "date-time"},
			"last_seen":   obj{"type": "string", "format": "date-time"},
			"replayed_at": obj{"type": "string", "format": "date-time"},
		},
	}
	schemas["DeadLetterSelection"] = obj{
		"type":                 "object",
		"additionalProperties": false,
		"description":          "The dead letters by ids or by filter: exactly one of the two.",
		"properties": obj{
			"ids":     obj{"type": "array", "minItems": 1, "items": obj{"type": "integer", "minimum": 1}},
			"filter":  ref("DeadLetterFilter"),
			"limit":   obj{"type": "integer", "minimum": 0, "description": "How many at most; 0 or absent for the default."},
			"dry_run": obj{"type": "boolean", "description": "Answer what would be acted on, changing nothing."},
		},
	}
	schemas["DeadLetterOutcome"] = obj{
		"type":     "object",
		"required": []string{"dry_run", "matched"},
		"properties": obj{
			"dry_run": obj{"type": "boolean"},
			"matched": obj{"type": "array", "items": i64},
			"queued": obj{"type": "array", "description": "Redrive: the entries queued for the worker that owns their partition.", "items": obj{
				"type": "object", "required": []string{"id", "identity", "projection", "topic", "partition"},
				"properties": obj{"id": i64, "identity": str, "projection": str, "topic": str, "partition": i64},
			}},
			"purged": obj{"type": "array", "description": "Purge: the ids deleted.", "items": i64},
		},
	}
	schemas["OffsetReset"] = obj{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []string{"topic"},
		"description":          "The stored offsets of a topic's partitions (all when none are named) move to exactly one of to, to_offset and to_datetime.",
		"properties": obj{
			"topic":       obj{"type": "string", "minLength": 1},
			"partitions":  obj{"type": "array", "items": obj{"type": "integer", "minimum": 0}},
			"to":          obj{"type": "string", "enum": []string{"earliest", "latest"}},
			"to_offset":   obj{"type": "integer", "minimum": 0},
			"to_datetime": obj{"type": "string", "format": "date-time"},
			"dry_run":     obj{"type": "boolean"},
		},
	}
	schemas["OffsetResetOutcome"] = obj{
		"type":     "object",
		"required": []string{"dry_run", "partitions"},
		"properties": obj{
			"dry_run": obj{"type": "boolean"},
			"group":   str,
			"partitions": obj{"type": []string{"array", "null"}, "items": obj{
				"type":     "object",
				"required": []string{"topic", "partition", "current_offset", "new_offset", "log_start_offset", "log_end_offset"},
				"properties": obj{
					"topic": str, "partition": i64, "current_offset": nullable("integer"), "new_offset": i64,
					"log_start_offset": i64, "log_end_offset": i64, "owner_epoch": i64, "note": str,
				},
			}},
		},
	}
	schemas["RebuildStart"] = obj{
		"type":                 "object",
		"additionalProperties": false,
		"description":          "Empty, or a new definition of the projection; the actor is the token's subject.",
		"properties": obj{
			"definition":            obj{"type": "object", "description": "The projection's new definition, as an entry of the projection file."},
			"reader_schema":         str,
			"allow_partial_history": obj{"type": "boolean"},
			"retain":                obj{"type": "string", "description": "How long the retired generation is kept after the cutover, a duration such as 48h."},
		},
	}
	schemas["RebuildRollback"] = obj{"type": "object", "additionalProperties": false, "properties": obj{}}
	schemas["Operation"] = obj{
		"type":     "object",
		"required": []string{"operation_id", "identity", "projection", "kind", "state", "created_at"},
		"properties": obj{
			"operation_id": str, "identity": str, "projection": str, "kind": str,
			"generation": i64, "from_generation": i64, "state": str,
			"allow_partial_history": obj{"type": "boolean"},
			"actor":                 str,
			"records_done":          i64,
			"records_remaining":     nullable("integer"),
			"created_at":            obj{"type": "string", "format": "date-time"},
		},
	}
	bodyOf := func(schema string) obj {
		return obj{"required": true, "content": jsonBody(ref(schema))}
	}
	idParam := func(desc string, schema obj) obj {
		return obj{"name": "id", "in": "path", "required": true, "schema": schema, "description": desc}
	}
	nameParam := obj{"name": "name", "in": "path", "required": true, "schema": str, "description": "The projection's name."}

	listParams := []any{}
	for _, name := range []string{"identity", "projection", "topic", "key", "error_class", "status", "since", "until"} {
		param := obj{"name": name, "in": "query", "schema": obj{"type": "string"}}
		if d, ok := filterProps[name].(obj)["description"]; ok {
			param["description"] = d
		}
		listParams = append(listParams, param)
	}
	listParams = append(listParams,
		obj{"name": "limit", "in": "query", "schema": obj{"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}},
		obj{"name": "after", "in": "query", "schema": obj{"type": "integer", "minimum": 1},
			"description": "Only dead letters of a higher id: the next page, as a page's next link gives it."})

	paths["/admin/v1/dead-letters"] = obj{"get": adminOp("listDeadLetters", "Dead letters, oldest first (by id), with the CLI's filters, a page at a time.", listParams, nil,
		merge(obj{"200": jsonResponse("The dead letters.", obj{
			"type": "object", "required": []string{"dead_letters"},
			"properties": obj{
				"dead_letters": obj{"type": "array", "items": ref("DeadLetter")},
				"next": obj{"type": "string", "format": "uri-reference",
					"description": "The next page: present when this one is full, and then possibly empty."},
			},
		})}, adminErrors(400)))}
	paths["/admin/v1/dead-letters/{id}"] = obj{"get": adminOp("getDeadLetter", "A dead letter.",
		[]any{idParam("The dead letter's id.", obj{"type": "string", "pattern": "^[0-9]+$"})}, nil,
		merge(obj{"200": jsonResponse("The dead letter.", ref("DeadLetter"))}, adminErrors(400, 404)))}
	paths["/admin/v1/dead-letters/redrives"] = obj{"post": adminOp("redriveDeadLetters",
		"Queue dead letters for the worker that owns their partition, which applies them in its own transaction; audited.",
		nil, bodyOf("DeadLetterSelection"),
		merge(obj{
			"200": jsonResponse("A dry run: what would be queued.", ref("DeadLetterOutcome")),
			"202": jsonResponse("Queued.", ref("DeadLetterOutcome")),
		}, adminErrors(400, 413)))}
	paths["/admin/v1/dead-letters/purges"] = obj{"post": adminOp("purgeDeadLetters", "Delete dead letters; audited.",
		nil, bodyOf("DeadLetterSelection"),
		merge(obj{"200": jsonResponse("Purged, or with dry_run what would be.", ref("DeadLetterOutcome"))}, adminErrors(400, 413)))}
	paths["/admin/v1/offsets/resets"] = obj{"post": adminOp("resetOffsets",
		"Move the stored offsets of a topic's partitions; audited. Only a process that reaches the brokers (run --api) serves it: serve answers 501.",
		nil, bodyOf("OffsetReset"),
		merge(obj{"200": jsonResponse("The plan, carried out unless dry_run.", ref("OffsetResetOutcome"))}, adminErrors(400, 413, 501)))}
	opResponses := func(ok string, statuses ...int) obj {
		code := "200"
		if ok == "202" {
			code = "202"
		}
		return merge(obj{code: jsonResponse("The operation.", ref("Operation"))}, adminErrors(statuses...))
	}
	paths["/admin/v1/projections/{name}/rebuilds"] = obj{"post": adminOp("startRebuild",
		"Rebuild a projection into a new generation, cut over when caught up.",
		[]any{nameParam}, obj{"content": jsonBody(ref("RebuildStart"))}, opResponses("202", 400, 404, 409, 413))}
	paths["/admin/v1/projections/{name}/rollbacks"] = obj{"post": adminOp("rollBack",
		"Make the retired generation live again.",
		[]any{nameParam}, obj{"content": jsonBody(ref("RebuildRollback"))}, opResponses("202", 400, 404, 409, 413))}
	paths["/admin/v1/operations"] = obj{"get": adminOp("listOperations", "The rebuild and rollback operations in flight.", nil, nil,
		merge(obj{"200": jsonResponse("The operations.", obj{
			"type": "object", "required": []string{"operations"},
			"properties": obj{"operations": obj{"type": "array", "items": ref("Operation")}},
		})}, adminErrors()))}
	opID := idParam("The operation's id.", str)
	paths["/admin/v1/operations/{id}"] = obj{
		"get":    adminOp("getOperation", "An operation.", []any{opID}, nil, opResponses("200", 404)),
		"delete": adminOp("cancelOperation", "Cancel an operation before its cutover.", []any{opID}, nil, opResponses("200", 400, 404, 409)),
	}
}

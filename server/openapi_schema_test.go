package server

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
)

// A small validator for the JSON Schema subset openapi.json uses ($ref,
// type, properties, required, additionalProperties, items, enum, pattern,
// oneOf, minimum, maximum), so that the drift test can check every body
// the server sends and accepts against the document.

// apiDoc is openapi.json, parsed.
type apiDoc struct {
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas   map[string]json.RawMessage `json:"schemas"`
		Responses map[string]apiResponse     `json:"responses"`
	} `json:"components"`
}

type apiOperation struct {
	Parameters  []apiParameter         `json:"parameters"`
	RequestBody *apiBody               `json:"requestBody"`
	Responses   map[string]apiResponse `json:"responses"`
	XQuery      string                 `json:"x-beacon-query"`
}

type apiParameter struct {
	Name string `json:"name"`
	In   string `json:"in"`
}

type apiBody struct {
	Required bool                    `json:"required"`
	Content  map[string]apiMediaType `json:"content"`
}

type apiResponse struct {
	Ref     string                  `json:"$ref"`
	Content map[string]apiMediaType `json:"content"`
}

type apiMediaType struct {
	Schema json.RawMessage `json:"schema"`
}

// operation returns the operation of path and method (lower case), with
// the path's own parameters added.
func (d *apiDoc) operation(path, method string) (apiOperation, bool) {
	item, ok := d.Paths[path]
	if !ok {
		return apiOperation{}, false
	}
	raw, ok := item[method]
	if !ok {
		return apiOperation{}, false
	}
	var op apiOperation
	if err := json.Unmarshal(raw, &op); err != nil {
		return apiOperation{}, false
	}
	if pr, ok := item["parameters"]; ok {
		var ps []apiParameter
		_ = json.Unmarshal(pr, &ps)
		op.Parameters = append(op.Parameters, ps...)
	}
	return op, true
}

// response resolves a documented status of op.
func (d *apiDoc) response(op apiOperation, status string) (apiResponse, bool) {
	r, ok := op.Responses[status]
	if !ok {
		return apiResponse{}, false
	}
	if r.Ref != "" {
		r, ok = d.Components.Responses[strings.TrimPrefix(r.Ref, "#/components/responses/")]
	}
	return r, ok
}

// validate checks v (decoded JSON) against schema; it returns the problems
// found, each with the JSON path.
func (d *apiDoc) validate(schema json.RawMessage, v any, at string) []string {
	var s map[string]json.RawMessage
	if err := json.Unmarshal(schema, &s); err != nil {
		return []string{fmt.Sprintf("%s: unreadable schema %s", at, schema)}
	}
	if ref, ok := s["$ref"]; ok {
		var name string
		_ = json.Unmarshal(ref, &name)
		target, ok := d.Components.Schemas[strings.TrimPrefix(name, "#/components/schemas/")]
		if !ok {
			return []string{fmt.Sprintf("%s: unknown $ref %s", at, name)}
		}
		return d.validate(target, v, at)
	}
	if raw, ok := s["oneOf"]; ok {
		var alts []json.RawMessage
		_ = json.Unmarshal(raw, &alts)
		matched := 0
		for _, alt := range alts {
			if len(d.validate(alt, v, at)) == 0 {
				matched++
			}
		}
		if matched != 1 {
			return []string{fmt.Sprintf("%s: %v matches %d of the oneOf schemas, want 1", at, v, matched)}
		}
		return nil
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, at+": "+fmt.Sprintf(format, args...)) }
	var typ string
	if raw, ok := s["type"]; ok {
		_ = json.Unmarshal(raw, &typ)
		if !hasType(v, typ) {
			bad("%v (%T) is not of type %s", v, v, typ)
			return problems
		}
	}
	if raw, ok := s["enum"]; ok {
		var enum []any
		_ = json.Unmarshal(raw, &enum)
		found := false
		for _, e := range enum {
			if fmt.Sprint(e) == fmt.Sprint(v) {
				found = true
			}
		}
		if !found {
			bad("%v is not one of %v", v, enum)
		}
	}
	if raw, ok := s["pattern"]; ok {
		var pat string
		_ = json.Unmarshal(raw, &pat)
		if str, ok := v.(string); ok && !regexp.MustCompile(pat).MatchString(str) {
			bad("%q does not match %s", str, pat)
		}
	}
	if n, ok := v.(float64); ok {
		var lim float64
		if raw, ok := s["minimum"]; ok && json.Unmarshal(raw, &lim) == nil && n < lim {
			bad("%v is below the minimum %v", n, lim)
		}
		if raw, ok := s["maximum"]; ok && json.Unmarshal(raw, &lim) == nil && n > lim {
			bad("%v is above the maximum %v", n, lim)
		}
	}
	switch val := v.(type) {
	case map[string]any:
		var props map[string]json.RawMessage
		if raw, ok := s["properties"]; ok {
			_ = json.Unmarshal(raw, &props)
		}
		if raw, ok := s["required"]; ok {
			var req []string
			_ = json.Unmarshal(raw, &req)
			for _, r := range req {
				if _, ok := val[r]; !ok {
					bad("required property %q is missing", r)
				}
			}
		}
		keys := make([]string, 0, len(val))
		for k := range val {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if ps, ok := props[k]; ok {
				problems = append(problems, d.validate(ps, val[k], at+"."+k)...)
				continue
			}
			if raw, ok := s["additionalProperties"]; ok {
				if string(raw) == "false" {
					if props != nil {
						bad("property %q is not in the schema", k)
					}
					continue
				}
				if string(raw) != "true" {
					problems = append(problems, d.validate(raw, val[k], at+"."+k)...)
				}
			} else if props != nil {
				bad("property %q is not documented", k)
			}
		}
	case []any:
		if raw, ok := s["items"]; ok {
			for i, item := range val {
				problems = append(problems, d.validate(raw, item, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	}
	return problems
}

func hasType(v any, typ string) bool {
	switch typ {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		n, ok := v.(float64)
		return ok && n == math.Trunc(n)
	}
	return true
}

package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// checkKeys walks data, a JSON value that decoded into a value of type t
// without error, and refuses what encoding/json accepts silently: an
// object key given twice, at any depth (the decoder keeps the last one,
// so two readers of one body could see different values), and a key that
// names a field of t only in another letter case (the decoder matches
// {"Address":...} to the field address; the API's names are
// case-sensitive). A map's keys are free (metadata keeps any key), but
// not duplicated either. And a null anywhere: the decoder takes it as the
// zero value ({"size":null} was the default size, {"metadata":null} in a
// PATCH left the metadata unchanged, {"k":null} in metadata was ""),
// which the sender cannot have meant.
func checkKeys(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkKeys(dec, t, "")
}

// walkKeys reads one value from dec. t is the Go type it decodes into, or
// nil when unknown (then only duplicates are checked below it).
func walkKeys(dec *json.Decoder, t reflect.Type, at string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t != nil && (reflect.PointerTo(t).Implements(unmarshalerType) || t.Implements(unmarshalerType)) {
		t = nil // its own syntax: only duplicates are checked
	}
	switch tok {
	case nil:
		if at == "" {
			return errors.New("the body is null: send a JSON object")
		}
		return fmt.Errorf("%q is null: null is not a value here: give one, or leave the field out", at)
	case json.Delim('{'):
		var fields map[string]reflect.Type
		var elem reflect.Type
		if t != nil {
			switch t.Kind() {
			case reflect.Struct:
				fields = jsonFields(t)
			case reflect.Map:
				elem = t.Elem()
			}
		}
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := kt.(string)
			where := key
			if at != "" {
				where = at + "." + key
			}
			if seen[key] {
				return fmt.Errorf("key %q is given twice: give each key once", where)
			}
			seen[key] = true
			vt := elem
			if fields != nil {
				ft, ok := fields[key]
				if !ok {
					for name := range fields {
						if strings.EqualFold(name, key) {
							return fmt.Errorf("unknown field %q: field names are case-sensitive: did you mean %q?", where, name)
						}
					}
				}
				vt = ft
			}
			if err := walkKeys(dec, vt, where); err != nil {
				return err
			}
		}
		_, err := dec.Token() // '}'
		return err
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walkKeys(dec, elem, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
		_, err := dec.Token() // ']'
		return err
	}
	return nil
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// jsonFields returns the JSON names of a struct's fields as
// encoding/json names them (the tag's name, else the Go name; embedded
// structs' fields promoted), with each field's type.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for n, typ := range jsonFields(ft) {
					if _, ok := out[n]; !ok {
						out[n] = typ
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// errKeys marks a checkKeys refusal.
var errKeys = errors.New("JSON body")

func strictKeys(body []byte, v any) error {
	if err := checkKeys(body, reflect.TypeOf(v)); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %w", errKeys, err)
	}
	return nil
}

package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// MaxYAMLDocumentBytes bounds one YAML document. A YAML document is
// converted to JSON whole (sigs.k8s.io/yaml builds its tree first, at
// about 20 times its size), so one document is the unit of memory; JSON is
// read one List item at a time and has no such bound.
const MaxYAMLDocumentBytes = 16 << 20

// maxJSONDepth is encoding/json's own nesting limit, kept by the token
// walk that rebuilds a top-level "items" that is not an array.
const maxJSONDepth = 10000

// DecodeError is an error about the object at Index: the number of objects
// handed out before it (List items count individually), the numbering
// callers show as "(document N)".
type DecodeError struct {
	Index int
	Err   error
}

func (e *DecodeError) Error() string { return fmt.Sprintf("(document %d): %v", e.Index, e.Err) }
func (e *DecodeError) Unwrap() error { return e.Err }

// errDocTooLarge ends a YAML document past MaxYAMLDocumentBytes.
var errDocTooLarge = errors.New("YAML document too large")

// Objects reads the Kubernetes objects in r and calls fn with each one's
// JSON, in order, until r ends or fn returns an error (returned as is).
// r holds JSON values one after another (when its first non-blank byte is
// "{", as k8s.io/apimachinery's YAMLOrJSONDecoder decides) or YAML
// documents. A List (an object whose top-level "items" is an array, as
// unstructured.Unstructured.IsList) is expanded: fn gets each item, and
// the items are decoded one at a time, never the whole List, so a caller
// bounding the count in fn stops a huge List after the bound. Empty
// documents and null are skipped; a List item that is not an object, a
// top-level value that is not an object, or a List without a kind is an
// error. Memory is the largest JSON item, or for YAML one document of at
// most MaxYAMLDocumentBytes. Errors about the input are *DecodeError.
func Objects(r io.Reader, fn func(obj []byte) error) error {
	br := bufio.NewReaderSize(r, 4096)
	s := &stream{fn: fn}
	if head, _ := br.Peek(4096); bytes.HasPrefix(bytes.TrimLeft(head, " \t\r\n"), []byte("{")) {
		return s.json(br)
	}
	lim := &docLimit{r: br}
	docs := utilyaml.NewYAMLReader(bufio.NewReader(lim))
	for {
		lim.n = 0
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if errors.Is(err, errDocTooLarge) {
			return &DecodeError{Index: s.n, Err: fmt.Errorf("YAML document larger than %d bytes (YAML is converted one whole document at a time; write a large state as JSON, kubectl get -o json, which is read item by item, or as one document per object)", MaxYAMLDocumentBytes)}
		}
		if err != nil {
			return s.err(err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return s.err(err)
		}
		if err := s.json(bytes.NewReader(j)); err != nil {
			return err
		}
	}
}

// docLimit fails once more than MaxYAMLDocumentBytes (plus the read-ahead
// of the readers above it) are read since n was last reset.
type docLimit struct {
	r io.Reader
	n int
}

func (d *docLimit) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if d.n += n; d.n > MaxYAMLDocumentBytes+2*4096 {
		return n, errDocTooLarge
	}
	return n, err
}

// stream hands objects to fn and counts them.
type stream struct {
	fn func([]byte) error
	n  int // objects handed out
}

func (s *stream) err(err error) error { return &DecodeError{Index: s.n, Err: err} }

func (s *stream) emit(obj []byte) error {
	if err := s.fn(obj); err != nil {
		return err
	}
	s.n++
	return nil
}

// json reads a stream of JSON values.
func (s *stream) json(r io.Reader) error {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return s.err(err)
		}
		switch tok {
		case json.Delim('{'):
			if err := s.object(dec); err != nil {
				return err
			}
		case nil:
		default:
			return s.err(fmt.Errorf("a manifest must be a JSON object, got %v", tok))
		}
	}
}

// object reads one top-level object after its "{": its fields one at a
// time, and a top-level "items" array one item at a time.
func (s *stream) object(dec *json.Decoder) error {
	var buf bytes.Buffer
	buf.WriteByte('{')
	list, kind := false, false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return s.err(err)
		}
		key, _ := tok.(string)
		if buf.Len() > 1 {
			buf.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		buf.Write(k)
		buf.WriteByte(':')
		if key == "items" {
			tok, err := dec.Token()
			if err != nil {
				return s.err(err)
			}
			if tok == json.Delim('[') {
				list = true
				if err := s.items(dec); err != nil {
					return err
				}
				buf.WriteString("[]")
				continue
			}
			if err := rebuild(dec, tok, &buf, 0); err != nil {
				return s.err(err)
			}
			continue
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return s.err(err)
		}
		if key == "kind" {
			var str string
			kind = json.Unmarshal(v, &str) == nil && str != ""
		}
		buf.Write(v)
	}
	if _, err := dec.Token(); err != nil { // the closing "}"
		return s.err(err)
	}
	if !list {
		buf.WriteByte('}')
		return s.emit(buf.Bytes())
	}
	if !kind {
		return s.err(errors.New("a List needs a kind"))
	}
	return nil
}

// items hands out the elements of an "items" array after its "[".
func (s *stream) items(dec *json.Decoder) error {
	for dec.More() {
		var item json.RawMessage
		if err := dec.Decode(&item); err != nil {
			return s.err(err)
		}
		if len(item) == 0 || item[0] != '{' {
			return s.err(fmt.Errorf("items member is not an object: %.40s", item))
		}
		if err := s.emit(item); err != nil {
			return err
		}
	}
	_, err := dec.Token() // the closing "]"
	if err != nil {
		return s.err(err)
	}
	return nil
}

// rebuild writes the JSON value starting with tok (already read) to buf.
func rebuild(dec *json.Decoder, tok json.Token, buf *bytes.Buffer, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("exceeded max depth %d", maxJSONDepth)
	}
	switch tok {
	case json.Delim('{'), json.Delim('['):
		open := tok.(json.Delim)
		buf.WriteRune(rune(open))
		for first := true; dec.More(); first = false {
			if !first {
				buf.WriteByte(',')
			}
			t, err := dec.Token()
			if err != nil {
				return err
			}
			if open == '{' {
				k, _ := json.Marshal(t)
				buf.Write(k)
				buf.WriteByte(':')
				if t, err = dec.Token(); err != nil {
					return err
				}
			}
			if err := rebuild(dec, t, buf, depth+1); err != nil {
				return err
			}
		}
		end, err := dec.Token()
		if err != nil {
			return err
		}
		buf.WriteRune(rune(end.(json.Delim)))
		return nil
	}
	b, err := json.Marshal(tok) // string, json.Number, bool or nil
	if err != nil {
		return err
	}
	buf.Write(b)
	return nil
}

package msgtmpl

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"text/template"
)

// funcs are the functions of every message template, by name. Add a
// function here (or from an init function in this package) to make it
// available to every template at once.
var funcs = template.FuncMap{
	"json": jsonFunc,
	"form": formFunc,
}

// jsonFunc is the template function json: its argument encoded as JSON.
func jsonFunc(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// formFunc is the template function form. It encodes either one map or
// alternating keys and values as application/x-www-form-urlencoded, keys
// sorted. A slice value adds the key once for each element; other values
// are formatted with fmt.Sprint.
func formFunc(args ...any) (string, error) {
	vals := url.Values{}
	switch {
	case len(args) == 1:
		switch m := args[0].(type) {
		case map[string]any:
			for k, v := range m {
				addFormValue(vals, k, v)
			}
		case map[string]string:
			for k, v := range m {
				vals.Add(k, v)
			}
		case url.Values:
			vals = m
		default:
			return "", fmt.Errorf("form: want a map or key-value pairs, got %T", args[0])
		}
	case len(args)%2 == 0:
		for i := 0; i < len(args); i += 2 {
			k, ok := args[i].(string)
			if !ok {
				return "", fmt.Errorf("form: key %d is a %T, not a string", i/2+1, args[i])
			}
			addFormValue(vals, k, args[i+1])
		}
	default:
		return "", errors.New("form: want a map or an even number of key-value arguments")
	}
	return vals.Encode(), nil
}

func addFormValue(vals url.Values, k string, v any) {
	switch v := v.(type) {
	case nil:
		vals.Add(k, "")
	case string:
		vals.Add(k, v)
	case []any:
		for _, e := range v {
			vals.Add(k, fmt.Sprint(e))
		}
	case []string:
		for _, e := range v {
			vals.Add(k, e)
		}
	default:
		vals.Add(k, fmt.Sprint(v))
	}
}

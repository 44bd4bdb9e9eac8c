package msgtmpl

import (
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
)

func TestE164(t *testing.T) {
	for _, c := range []struct{ body, want, err string }{
		{`{"to":"+1 (212) 555-0100"}`, "+12125550100", ""},
		{`{"to":"12125550100"}`, "+12125550100", ""},
		{`{"to":12125550100}`, "+12125550100", ""},
		{`{"to":"0033 6 12 34 56 78"}`, "+33612345678", ""},
		{`{"to":"call me"}`, "", "not an international telephone number"},
		{`{"to":null}`, "", "null or missing"},
		{`{"to":true}`, "", "want a string"},
	} {
		tmpl, err := Parse("key", `{{e164 .JSON.to}}`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Render(tmpl, NewData(consumer.Message{Body: []byte(c.body)}))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %q, %v; want an error containing %q", c.body, got, err, c.err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %q, %v; want %q", c.body, got, err, c.want)
		}
	}
}

package httpsink_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// TestConfigRules: Config.Rules come before the defaults, can read a 200's
// body, and name themselves in the error.
func TestConfigRules(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/busy":
			fmt.Fprint(w, `{"ok":false,"error":"busy"}`)
		case "/dead":
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"ok":false,"error":"no such user"}`)
		default:
			fmt.Fprint(w, `{"ok":true}`)
		}
	}))
	defer srv.Close()
	rules := []httpsink.Rule{
		{Name: "busy", Status: []string{"200"}, Body: map[string][]string{"error": {"busy"}}, Action: httpsink.PushBack, Delay: 3 * time.Second},
		{Name: "no such user", Body: map[string][]string{"error": {"no such user"}}, Action: httpsink.Permanent, RecipientGone: true},
	}
	send := func(path string) error {
		s, err := httpsink.New(httpsink.Config{URL: srv.URL + path, Rules: rules})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		return s.Send(context.Background(), consumer.Message{Body: []byte(`{}`)})
	}
	if err := send("/ok"); err != nil {
		t.Errorf("ok: %v", err)
	}
	err := send("/busy")
	if d, ok := consumer.RetryAfterOf(err); !ok || d != 3*time.Second || consumer.IsPermanent(err) || !strings.Contains(err.Error(), "200 OK (busy)") {
		t.Errorf("busy: %v (delay %v), want a 3s push back naming the rule", err, d)
	}
	err = send("/dead")
	if !consumer.IsPermanent(err) || !httpsink.IsRecipientGone(err) {
		t.Errorf("dead: %v, want permanent and recipient gone", err)
	}
	err = (httpsink.Config{URL: srv.URL, Rules: []httpsink.Rule{{Action: httpsink.Retry}, {Name: "x", Action: "later"}}}).Validate()
	fes := sinks.FieldErrors(err)
	if len(fes) != 1 || fes[0].Field != "Rules" || !strings.Contains(fes[0].Err.Error(), `rule 1 (x): action "later"`) {
		t.Errorf("Validate = %v, want one Rules error naming rule 1", err)
	}
}

// TestURLTemplate: the URL may hold template actions; the error names the
// template, never the message's data; a message the template fails for is
// permanent.
func TestURLTemplate(t *testing.T) {
	paths := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths <- r.URL.Path + "?" + r.URL.RawQuery
		w.WriteHeader(http.StatusBadRequest)
	}))
	defer srv.Close()
	s, err := httpsink.New(httpsink.Config{URL: srv.URL + "/devices/{{.JSON.id}}/push?key=secret-key"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Send(context.Background(), consumer.Message{Body: []byte(`{"id":"dev-42"}`)})
	if got := <-paths; got != "/devices/dev-42/push?key=secret-key" {
		t.Errorf("request %q", got)
	}
	var serr *httpsink.StatusError
	if !errors.As(err, &serr) || strings.Contains(err.Error(), "dev-42") || strings.Contains(err.Error(), "secret-key") ||
		!strings.Contains(err.Error(), "/devices/{{.JSON.id}}/push") {
		t.Errorf("error %q: want the template path, without the id or the query", err)
	}
	err = s.Send(context.Background(), consumer.Message{Body: []byte(`{}`)})
	if !consumer.IsPermanent(err) {
		t.Errorf("missing id: %v, want permanent", err)
	}
	if err := (httpsink.Config{URL: "http://h/{{.JSON.id"}).Validate(); err == nil {
		t.Error("a URL template that does not parse is accepted")
	}
}

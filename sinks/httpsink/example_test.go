package httpsink_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// An SMS provider that takes a form-encoded body, built from a JSON event
// with a template. The token comes from the environment.
func ExampleNew_sms() {
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Println(r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		fmt.Println(r.Header.Get("Authorization"))
		fmt.Println(string(body))
		w.WriteHeader(http.StatusCreated)
	}))
	defer provider.Close()
	_ = os.Setenv("SMS_TOKEN", "example-token")
	token := os.Getenv("SMS_TOKEN")

	sink, err := httpsink.New(httpsink.Config{
		URL:          provider.URL + "/2010-04-01/Messages",
		Headers:      map[string]string{"Authorization": "Bearer " + token},
		ContentType:  "application/x-www-form-urlencoded",
		BodyTemplate: `To={{.JSON.to | urlquery}}&Body={{.JSON.text | urlquery}}`,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sink.Close()

	err = sink.Send(context.Background(), consumer.Message{
		Body: []byte(`{"to":"+15550100","text":"Your code is 1234"}`),
	})
	fmt.Println("error:", err)
	// Output:
	// POST /2010-04-01/Messages application/x-www-form-urlencoded
	// Bearer example-token
	// To=%2B15550100&Body=Your+code+is+1234
	// error: <nil>
}

// A push webhook that takes a JSON body; the template reshapes the event.
// A 429 comes back as a retryable error carrying the provider's delay,
// which consumer.PushBack turns into a pause for every replica.
func ExampleNew_push() {
	push := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Println(string(body))
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer push.Close()

	sink, err := httpsink.New(httpsink.Config{
		URL:          push.URL + "/v1/send",
		BodyTemplate: `{"token":{{json .JSON.device}},"notification":{"title":{{json .JSON.title}}}}`,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sink.Close()

	err = sink.Send(context.Background(), consumer.Message{
		Body: []byte(`{"device":"d-42","title":"Parcel shipped"}`),
	})
	after, _ := consumer.RetryAfterOf(err)
	fmt.Println("permanent:", consumer.IsPermanent(err), "retry after:", after)
	// Output:
	// {"token":"d-42","notification":{"title":"Parcel shipped"}}
	// permanent: false retry after: 2s
}

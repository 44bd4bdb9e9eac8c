package httpsink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Preset names, for Config.Preset.
const (
	// PresetTwilio sends SMS with Twilio's Messages resource.
	PresetTwilio = "twilio"
	// PresetVonage sends SMS with Vonage's Messages API.
	PresetVonage = "vonage"
	// PresetVonageSMS sends SMS with Vonage's legacy SMS API, which
	// answers 200 and puts the outcome in the body.
	PresetVonageSMS = "vonage_sms"
	// PresetFCM sends push notifications with the FCM HTTP v1 API.
	PresetFCM = "fcm"
	// PresetAPNs sends push notifications to Apple's APNs over HTTP/2.
	PresetAPNs = "apns"
)

// Presets lists the preset names.
var Presets = []string{PresetTwilio, PresetVonage, PresetVonageSMS, PresetFCM, PresetAPNs}

// Credentials are what a preset authenticates with. A zero field is read
// from the environment variable that the preset names for it; secrets are
// never logged nor quoted in errors.
type Credentials struct {
	// Username is Twilio's account SID (TWILIO_ACCOUNT_SID) or Vonage's
	// API key (VONAGE_API_KEY).
	Username string
	// Password is Twilio's auth token (TWILIO_AUTH_TOKEN) or Vonage's API
	// secret (VONAGE_API_SECRET).
	Password string
	// KeyFile is the path of FCM's service-account JSON key
	// (GOOGLE_APPLICATION_CREDENTIALS) or of the APNs signing key, a .p8
	// file (APNS_KEY_FILE).
	KeyFile string
	// KeyID is the APNs key id (APNS_KEY_ID).
	KeyID string
	// TeamID is the Apple developer team id (APNS_TEAM_ID).
	TeamID string
	// ProjectID is the Firebase project id (FCM_PROJECT_ID); by default
	// the service-account key's project_id.
	ProjectID string
}

// presetSpec is what a preset fills in.
type presetSpec struct {
	base         string // default base URL
	method       string
	contentType  string
	bodyTemplate string
	rules        []Rule
}

var presetSpecs = map[string]presetSpec{
	PresetTwilio: {
		base:         "https://api.twilio.com",
		contentType:  "application/x-www-form-urlencoded",
		bodyTemplate: `{{form "To" .JSON.to "From" .JSON.from "Body" .JSON.text}}`,
		rules: []Rule{
			{Name: "twilio 21610 unsubscribed recipient", Body: map[string][]string{"code": {"21610"}}, Action: Permanent, RecipientGone: true},
			{Name: "twilio 21614 not a mobile number", Body: map[string][]string{"code": {"21614"}}, Action: Permanent, RecipientGone: true},
			{Name: "twilio 21211 invalid To number", Body: map[string][]string{"code": {"21211"}}, Action: Permanent},
			{Name: "twilio 30001 queue overflow", Body: map[string][]string{"code": {"30001"}}, Action: PushBack},
			{Name: "twilio 21611 sender queue full", Body: map[string][]string{"code": {"21611"}}, Action: PushBack},
			{Name: "twilio 429 too many requests", Status: []string{"429"}, Action: Retry, Delay: time.Second},
			{Name: "twilio 20429 too many requests", Body: map[string][]string{"code": {"20429"}}, Action: Retry, Delay: time.Second},
			{Name: "twilio credentials rejected", Status: []string{"401", "403"}, Action: Permanent},
		},
	},
	PresetVonage: {
		base:         "https://api.nexmo.com",
		contentType:  "application/json",
		bodyTemplate: `{"message_type":"text","channel":"sms","to":{{json .JSON.to}},"from":{{json .JSON.from}},"text":{{json .JSON.text}}}`,
		rules: []Rule{
			{Name: "vonage 429 rate limit", Status: []string{"429"}, Action: PushBack},
			{Name: "vonage credentials rejected", Status: []string{"401", "403"}, Action: Permanent},
		},
	},
	PresetVonageSMS: {
		base:        "https://rest.nexmo.com",
		contentType: "application/x-www-form-urlencoded",
		// type=unicode is required for UCS-2 text, else it arrives garbled.
		bodyTemplate: `{{$type := "text"}}{{if eq (sms_encoding .JSON.text) "UCS-2"}}{{$type = "unicode"}}{{end}}` +
			`{{form "to" .JSON.to "from" .JSON.from "text" .JSON.text "type" $type}}`,
		rules: []Rule{
			{Name: "vonage sms status 0 success", Status: []string{"2xx"}, Body: map[string][]string{"messages.0.status": {"0"}}, Action: Delivered},
			{Name: "vonage sms status 1 throttled", Status: []string{"2xx"}, Body: map[string][]string{"messages.0.status": {"1"}}, Action: PushBack},
			{Name: "vonage sms status 5 internal error", Status: []string{"2xx"}, Body: map[string][]string{"messages.0.status": {"5", "13"}}, Action: Retry},
			{Name: "vonage sms status 7 number barred", Status: []string{"2xx"}, Body: map[string][]string{"messages.0.status": {"7"}}, Action: Permanent, RecipientGone: true},
			{Name: "vonage sms status 4 invalid credentials", Status: []string{"2xx"}, Body: map[string][]string{"messages.0.status": {"4"}}, Action: Permanent},
			{Name: "vonage sms non-zero status", Status: []string{"2xx"}, Body: map[string][]string{"messages.0.status": nil}, Action: Permanent},
			{Name: "vonage sms 2xx without a status", Status: []string{"2xx"}, Action: Permanent},
		},
	},
	PresetFCM: {
		base:         "https://fcm.googleapis.com",
		contentType:  "application/json",
		bodyTemplate: `{"message":{{json .JSON}}}`,
		rules: []Rule{
			{Name: "fcm UNREGISTERED", Status: []string{"404"}, Body: map[string][]string{"error.details.0.errorCode": {"UNREGISTERED"}}, Action: Permanent, RecipientGone: true},
			{Name: "fcm INVALID_ARGUMENT", Status: []string{"400"}, Action: Permanent},
			{Name: "fcm RESOURCE_EXHAUSTED", Status: []string{"429"}, Action: PushBack},
			{Name: "fcm 500 or 503", Status: []string{"500", "503"}, Action: Retry},
			{Name: "fcm credentials rejected", Status: []string{"401", "403"}, Action: Permanent},
		},
	},
	PresetAPNs: {
		base:         "https://api.push.apple.com",
		contentType:  "application/json",
		bodyTemplate: `{{json .JSON.payload}}`,
		rules: []Rule{
			{Name: "apns 410 Unregistered", Status: []string{"410"}, Action: Permanent, RecipientGone: true},
			{Name: "apns 400 BadDeviceToken", Status: []string{"400"}, Body: map[string][]string{"reason": {"BadDeviceToken"}}, Action: Permanent},
			// TooManyRequests is about one device token, not the
			// provider: retry that message, do not pause everyone.
			{Name: "apns 429 TooManyRequests", Status: []string{"429"}, Body: map[string][]string{"reason": {"TooManyRequests"}}, Action: Retry},
			{Name: "apns provider token rejected", Status: []string{"403"}, Action: Permanent},
		},
	},
}

// presetEnv names the environment variable of each credential, by preset.
var presetEnv = map[string]map[string]string{
	PresetTwilio:    {"Username": "TWILIO_ACCOUNT_SID", "Password": "TWILIO_AUTH_TOKEN"},
	PresetVonage:    {"Username": "VONAGE_API_KEY", "Password": "VONAGE_API_SECRET"},
	PresetVonageSMS: {"Username": "VONAGE_API_KEY", "Password": "VONAGE_API_SECRET"},
	PresetFCM:       {"KeyFile": "GOOGLE_APPLICATION_CREDENTIALS", "ProjectID": "FCM_PROJECT_ID"},
	PresetAPNs:      {"KeyFile": "APNS_KEY_FILE", "KeyID": "APNS_KEY_ID", "TeamID": "APNS_TEAM_ID"},
}

// EnvAPNsTopic is the environment variable the apns preset takes the
// apns-topic header from when Config.Headers has none.
const EnvAPNsTopic = "APNS_TOPIC"

// resolvedPreset is a preset with its credentials loaded.
type resolvedPreset struct {
	url          string // full URL; may hold template actions (apns)
	method       string
	contentType  string
	bodyTemplate string
	headers      map[string]string
	rules        []Rule
	auth         Authorizer
	checker      Checker
}

// presetEnvFuncs are how a preset reads the environment and files; tests
// replace them.
type presetEnvFuncs struct {
	lookup   func(string) (string, bool)
	readFile func(string) ([]byte, error)
}

func defaultPresetEnv() presetEnvFuncs {
	return presetEnvFuncs{lookup: os.LookupEnv, readFile: os.ReadFile}
}

// resolvePreset loads the named preset. baseURL, when set, replaces the
// preset's scheme, host and any path prefix; headers are the caller's, to
// see whether apns-topic is set. client fetches tokens (FCM) and checks
// credentials (Twilio).
func resolvePreset(name, baseURL string, creds Credentials, headers map[string]string, env presetEnvFuncs, client *http.Client) (*resolvedPreset, error) {
	spec, ok := presetSpecs[name]
	if !ok {
		return nil, fmt.Errorf("preset %q is not one of %s", name, strings.Join(Presets, ", "))
	}
	fill := func(field string, v *string) {
		if *v == "" {
			if e := presetEnv[name][field]; e != "" {
				*v, _ = env.lookup(e)
			}
		}
	}
	fill("Username", &creds.Username)
	fill("Password", &creds.Password)
	fill("KeyFile", &creds.KeyFile)
	fill("KeyID", &creds.KeyID)
	fill("TeamID", &creds.TeamID)
	fill("ProjectID", &creds.ProjectID)
	need := func(field, v string) error {
		if v != "" {
			return nil
		}
		return fmt.Errorf("preset %s: Credentials.%s is empty and %s is not set", name, field, presetEnv[name][field])
	}

	base := spec.base
	if baseURL != "" {
		base = baseURL
	}
	base = strings.TrimRight(base, "/")
	p := &resolvedPreset{
		method:       http.MethodPost,
		contentType:  spec.contentType,
		bodyTemplate: spec.bodyTemplate,
		headers:      map[string]string{},
		rules:        spec.rules,
	}
	switch name {
	case PresetTwilio:
		if err := errors.Join(need("Username", creds.Username), need("Password", creds.Password)); err != nil {
			return nil, err
		}
		account := base + "/2010-04-01/Accounts/" + url.PathEscape(creds.Username)
		p.url = account + "/Messages.json"
		auth := basicAuth{creds.Username, creds.Password}
		p.auth = auth
		p.checker = &getCheck{name: name, url: account + ".json", auth: auth, client: client}
	case PresetVonage:
		if err := errors.Join(need("Username", creds.Username), need("Password", creds.Password)); err != nil {
			return nil, err
		}
		p.url = base + "/v1/messages"
		p.auth = basicAuth{creds.Username, creds.Password}
	case PresetVonageSMS:
		if err := errors.Join(need("Username", creds.Username), need("Password", creds.Password)); err != nil {
			return nil, err
		}
		p.url = base + "/sms/json"
		p.auth = formAuth{fields: url.Values{"api_key": {creds.Username}, "api_secret": {creds.Password}}}
	case PresetFCM:
		if err := need("KeyFile", creds.KeyFile); err != nil {
			return nil, err
		}
		key, err := env.readFile(creds.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("preset fcm: reading the service-account key: %w", err)
		}
		auth, project, err := newOAuthAuth(key, client)
		if err != nil {
			return nil, fmt.Errorf("preset fcm: service-account key %s: %w", creds.KeyFile, err)
		}
		if creds.ProjectID != "" {
			project = creds.ProjectID
		}
		if project == "" {
			return nil, errors.New("preset fcm: the service-account key has no project_id; set Credentials.ProjectID or FCM_PROJECT_ID")
		}
		p.url = base + "/v1/projects/" + url.PathEscape(project) + "/messages:send"
		p.auth, p.checker = auth, auth
	case PresetAPNs:
		if err := errors.Join(need("KeyFile", creds.KeyFile), need("KeyID", creds.KeyID), need("TeamID", creds.TeamID)); err != nil {
			return nil, err
		}
		key, err := env.readFile(creds.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("preset apns: reading the signing key: %w", err)
		}
		auth, err := newAPNsAuth(key, creds.KeyID, creds.TeamID)
		if err != nil {
			return nil, fmt.Errorf("preset apns: signing key %s: %w", creds.KeyFile, err)
		}
		p.url = base + "/3/device/{{.JSON.token}}"
		p.auth = auth
		p.headers["apns-push-type"] = "alert"
		if !hasHeader(headers, "apns-topic") {
			topic, _ := env.lookup(EnvAPNsTopic)
			if topic == "" {
				return nil, fmt.Errorf("preset apns: set the apns-topic header (your app's bundle id) or %s", EnvAPNsTopic)
			}
			p.headers["apns-topic"] = topic
		}
	}
	return p, nil
}

func hasHeader(h map[string]string, name string) bool {
	for k := range h {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// getCheck verifies basic-auth credentials with a GET of a resource that
// needs them (Twilio's Account resource). Only a 401 or 403 fails the
// check: a provider that cannot be reached at start-up is not a reason to
// refuse to start.
type getCheck struct {
	name   string
	url    string
	auth   Authorizer
	client *http.Client
}

func (g *getCheck) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url, nil)
	if err != nil {
		return nil
	}
	if err := g.auth.Authorize(ctx, req); err != nil {
		return err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return fmt.Errorf("preset %s: the provider rejected the credentials: %s", g.name, resp.Status)
	}
	return nil
}

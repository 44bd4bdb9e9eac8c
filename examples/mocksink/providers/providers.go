// Package providers holds mock SMS and push providers that speak enough of
// each provider's HTTP API to test throttle's presets against: the auth
// check, the request shape, the answers for a delivered, a throttled and a
// rejected message, and a hidden rate limit answered with that provider's
// "too many requests" shape.
//
// Recipients pick the answer:
//
//   - an SMS number (twilio, vonage, vonage_sms) ending in 0000 has
//     unsubscribed, or is barred (the provider's "recipient gone" answer);
//     one ending in 9999 is invalid;
//   - a device token (fcm, apns) starting with "gone" is unregistered; one
//     starting with "bad" is malformed.
//
// Every other well-formed, authenticated request is delivered, unless it is
// beyond Config.Limit in its wall-clock second. A Provider is an
// http.Handler and safe for concurrent use; GET /mock/stats answers its
// Stats as JSON.
package providers

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/throttlehq/throttle/sinks/httpsink"
)

// Modes lists the provider modes, which are the httpsink preset names.
var Modes = httpsink.Presets

// Config configures a Provider.
type Config struct {
	// Mode is one of Modes.
	Mode string
	// Limit is the requests per wall-clock second answered normally; the
	// rest get the provider's rate-limit answer. 0 means no limit.
	Limit int
	// Username and Password are the expected basic-auth or form
	// credentials (twilio: account SID and auth token; vonage,
	// vonage_sms: API key and secret).
	Username, Password string
	// KeyID and TeamID are the expected APNs key id and team id.
	KeyID, TeamID string
	// ProjectID is the FCM project id. Default "mock-project".
	ProjectID string
	// TokenTTL is the lifetime of FCM access tokens. Default 1h.
	TokenTTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Stats counts what a Provider answered.
type Stats struct {
	Delivered    int            `json:"delivered"`
	Throttled    int            `json:"throttled"`
	Rejected     int            `json:"rejected"`
	Unauthorized int            `json:"unauthorized"`
	Tokens       int            `json:"tokens_issued"`
	ByRecipient  map[string]int `json:"delivered_by_recipient"`
}

// Provider is a mock provider.
type Provider struct {
	cfg    Config
	rsaKey *rsa.PrivateKey   // fcm: the service account's key
	ecKey  *ecdsa.PrivateKey // apns: the signing key

	mu       sync.Mutex
	second   int64
	inSecond int
	stats    Stats
	tokens   map[string]time.Time // fcm access token -> expiry
	seq      int
}

// New returns a Provider. For fcm it generates a service account's RSA
// key, for apns a P-256 signing key.
func New(cfg Config) (*Provider, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ProjectID == "" {
		cfg.ProjectID = "mock-project"
	}
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = time.Hour
	}
	p := &Provider{cfg: cfg, tokens: map[string]time.Time{}, stats: Stats{ByRecipient: map[string]int{}}}
	var err error
	switch cfg.Mode {
	case httpsink.PresetTwilio, httpsink.PresetVonage, httpsink.PresetVonageSMS:
		if cfg.Username == "" || cfg.Password == "" {
			return nil, fmt.Errorf("mode %s needs a username and a password", cfg.Mode)
		}
	case httpsink.PresetFCM:
		p.rsaKey, err = rsa.GenerateKey(rand.Reader, 2048)
	case httpsink.PresetAPNs:
		if cfg.KeyID == "" || cfg.TeamID == "" {
			return nil, errors.New("mode apns needs a key id and a team id")
		}
		p.ecKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		return nil, fmt.Errorf("mode %q is not one of %s", cfg.Mode, strings.Join(Modes, ", "))
	}
	return p, err
}

// ServiceAccountJSON returns a service-account key file for the fcm mode
// whose token_uri is tokenURI (this provider's URL + "/token").
func (p *Provider) ServiceAccountJSON(tokenURI string) []byte {
	return ServiceAccountJSON(p.rsaKey, p.cfg.ProjectID, tokenURI)
}

// ServiceAccountJSON builds a service-account key file for key.
func ServiceAccountJSON(key *rsa.PrivateKey, projectID, tokenURI string) []byte {
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	b, _ := json.MarshalIndent(map[string]string{
		"type":           "service_account",
		"project_id":     projectID,
		"private_key_id": "mock-key-1",
		"private_key":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":   "throttle@" + projectID + ".iam.gserviceaccount.com",
		"client_id":      "1",
		"token_uri":      tokenURI,
	}, "", "  ")
	return b
}

// SigningKeyPEM returns the apns mode's signing key as a .p8 file.
func (p *Provider) SigningKeyPEM() []byte { return SigningKeyPEM(p.ecKey) }

// SigningKeyPEM encodes key as a PKCS #8 PEM file, as Apple issues them.
func SigningKeyPEM(key *ecdsa.PrivateKey) []byte {
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// Stats returns a copy of the counters.
func (p *Provider) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.ByRecipient = make(map[string]int, len(p.stats.ByRecipient))
	for k, v := range p.stats.ByRecipient {
		s.ByRecipient[k] = v
	}
	return s
}

func (p *Provider) count(f func(*Stats)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.stats)
}

// admit reports whether a request is within the limit of its second.
func (p *Provider) admit() bool {
	sec := p.cfg.Now().Unix()
	p.mu.Lock()
	defer p.mu.Unlock()
	if sec != p.second {
		p.second, p.inSecond = sec, 0
	}
	if p.cfg.Limit > 0 && p.inSecond >= p.cfg.Limit {
		p.stats.Throttled++
		return false
	}
	p.inSecond++
	return true
}

func (p *Provider) delivered(to string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Delivered++
	p.stats.ByRecipient[to]++
	p.seq++
	return fmt.Sprintf("%08d", p.seq)
}

func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/mock/stats" {
		writeJSON(w, http.StatusOK, p.Stats())
		return
	}
	if r.URL.Path == "/healthz" {
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	switch p.cfg.Mode {
	case httpsink.PresetTwilio:
		p.twilio(w, r)
	case httpsink.PresetVonage:
		p.vonage(w, r)
	case httpsink.PresetVonageSMS:
		p.vonageSMS(w, r)
	case httpsink.PresetFCM:
		p.fcm(w, r)
	case httpsink.PresetAPNs:
		p.apns(w, r)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// smsFate is what the recipient number asks for.
func smsFate(to string) string {
	switch {
	case strings.HasSuffix(to, "0000"):
		return "gone"
	case strings.HasSuffix(to, "9999"):
		return "invalid"
	}
	return "ok"
}

// --- Twilio: https://www.twilio.com/docs/messaging/api/message-resource

func twilioError(w http.ResponseWriter, status, code int, msg string) {
	writeJSON(w, status, map[string]any{
		"code": code, "message": msg, "status": status,
		"more_info": fmt.Sprintf("https://www.twilio.com/docs/errors/%d", code),
	})
}

func (p *Provider) twilio(w http.ResponseWriter, r *http.Request) {
	user, pass, ok := r.BasicAuth()
	if !ok || user != p.cfg.Username || pass != p.cfg.Password {
		p.count(func(s *Stats) { s.Unauthorized++ })
		twilioError(w, http.StatusUnauthorized, 20003, "Authenticate")
		return
	}
	account := "/2010-04-01/Accounts/" + p.cfg.Username
	if r.Method == http.MethodGet && r.URL.Path == account+".json" {
		writeJSON(w, http.StatusOK, map[string]string{"sid": p.cfg.Username, "status": "active"})
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != account+"/Messages.json" {
		twilioError(w, http.StatusNotFound, 20404, "The requested resource was not found")
		return
	}
	if err := r.ParseForm(); err != nil || r.PostForm.Get("To") == "" || r.PostForm.Get("From") == "" {
		p.count(func(s *Stats) { s.Rejected++ })
		twilioError(w, http.StatusBadRequest, 21604, "A 'To' and a 'From' phone number are required")
		return
	}
	if r.PostForm.Get("Body") == "" {
		p.count(func(s *Stats) { s.Rejected++ })
		twilioError(w, http.StatusBadRequest, 21602, "Message body is required")
		return
	}
	if !p.admit() {
		twilioError(w, http.StatusTooManyRequests, 20429, "Too Many Requests")
		return
	}
	to := r.PostForm.Get("To")
	switch smsFate(to) {
	case "gone":
		p.count(func(s *Stats) { s.Rejected++ })
		twilioError(w, http.StatusBadRequest, 21610, "Attempt to send to unsubscribed recipient")
		return
	case "invalid":
		p.count(func(s *Stats) { s.Rejected++ })
		twilioError(w, http.StatusBadRequest, 21211, fmt.Sprintf("The 'To' number %s is not a valid phone number.", to))
		return
	}
	id := p.delivered(to)
	writeJSON(w, http.StatusCreated, map[string]any{"sid": "SM" + id, "status": "queued", "to": to, "num_segments": "1"})
}

// --- Vonage Messages API: https://developer.vonage.com/en/api/messages

func vonageError(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{
		"type": "https://developer.vonage.com/api-errors", "title": title, "detail": detail, "instance": "mock",
	})
}

func (p *Provider) vonage(w http.ResponseWriter, r *http.Request) {
	user, pass, ok := r.BasicAuth()
	if !ok || user != p.cfg.Username || pass != p.cfg.Password {
		p.count(func(s *Stats) { s.Unauthorized++ })
		vonageError(w, http.StatusUnauthorized, "Unauthorized", "You did not provide correct credentials.")
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		vonageError(w, http.StatusNotFound, "Not Found", r.URL.Path)
		return
	}
	var m struct{ MessageType, Channel, To, From, Text string }
	var raw map[string]any
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if json.Unmarshal(body, &raw) != nil {
		p.count(func(s *Stats) { s.Rejected++ })
		vonageError(w, http.StatusBadRequest, "Bad Request", "The request body is not JSON.")
		return
	}
	m.MessageType, _ = raw["message_type"].(string)
	m.Channel, _ = raw["channel"].(string)
	m.To, _ = raw["to"].(string)
	m.From, _ = raw["from"].(string)
	m.Text, _ = raw["text"].(string)
	if m.MessageType != "text" || m.Channel != "sms" || m.To == "" || m.From == "" || m.Text == "" {
		p.count(func(s *Stats) { s.Rejected++ })
		vonageError(w, http.StatusUnprocessableEntity, "Invalid params", "message_type, channel, to, from and text are required")
		return
	}
	if !p.admit() {
		vonageError(w, http.StatusTooManyRequests, "Rate Limit Hit", "Please wait, then retry your request")
		return
	}
	if smsFate(m.To) != "ok" {
		p.count(func(s *Stats) { s.Rejected++ })
		vonageError(w, http.StatusUnprocessableEntity, "Invalid params", "The value of the to parameter is invalid.")
		return
	}
	id := p.delivered(m.To)
	writeJSON(w, http.StatusAccepted, map[string]string{"message_uuid": "00000000-0000-0000-0000-" + id + "0000"})
}

// --- Vonage SMS API: https://developer.vonage.com/en/api/sms

func vonageSMSAnswer(w http.ResponseWriter, to, status, errText string) {
	m := map[string]string{"to": to, "status": status}
	if errText != "" {
		m["error-text"] = errText
	} else {
		m["message-id"] = "mock"
	}
	writeJSON(w, http.StatusOK, map[string]any{"message-count": "1", "messages": []any{m}})
}

func (p *Provider) vonageSMS(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/sms/json" {
		http.NotFound(w, r)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	f := r.PostForm
	to := f.Get("to")
	if f.Get("api_key") != p.cfg.Username || f.Get("api_secret") != p.cfg.Password {
		p.count(func(s *Stats) { s.Unauthorized++ })
		vonageSMSAnswer(w, to, "4", "Bad Credentials")
		return
	}
	if to == "" || f.Get("from") == "" || f.Get("text") == "" {
		p.count(func(s *Stats) { s.Rejected++ })
		vonageSMSAnswer(w, to, "2", "Missing to, from or text")
		return
	}
	if !p.admit() {
		vonageSMSAnswer(w, to, "1", "Throughput Rate Exceeded - please wait [ 1 ] and retry")
		return
	}
	switch smsFate(to) {
	case "gone":
		p.count(func(s *Stats) { s.Rejected++ })
		vonageSMSAnswer(w, to, "7", "Number barred")
		return
	case "invalid":
		p.count(func(s *Stats) { s.Rejected++ })
		vonageSMSAnswer(w, to, "3", "Invalid to address")
		return
	}
	p.delivered(to)
	vonageSMSAnswer(w, to, "0", "")
}

// --- FCM HTTP v1: https://firebase.google.com/docs/reference/fcm/rest/v1/projects.messages/send

func fcmError(w http.ResponseWriter, status int, grpc, fcmCode, msg string) {
	e := map[string]any{"code": status, "message": msg, "status": grpc}
	if fcmCode != "" {
		e["details"] = []any{map[string]string{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": fcmCode}}
	}
	writeJSON(w, status, map[string]any{"error": e})
}

func (p *Provider) fcm(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.Path == "/token" {
		p.fcmToken(w, r)
		return
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	p.mu.Lock()
	exp, known := p.tokens[tok]
	p.mu.Unlock()
	if !ok || !known || !p.cfg.Now().Before(exp) {
		p.count(func(s *Stats) { s.Unauthorized++ })
		fcmError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR", "Request had invalid authentication credentials.")
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/projects/"+p.cfg.ProjectID+"/messages:send" {
		fcmError(w, http.StatusNotFound, "NOT_FOUND", "", "Requested entity was not found.")
		return
	}
	var req struct {
		Message struct {
			Token string `json:"token"`
		} `json:"message"`
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if json.Unmarshal(body, &req) != nil || req.Message.Token == "" {
		p.count(func(s *Stats) { s.Rejected++ })
		fcmError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "The message has no registration token.")
		return
	}
	if !p.admit() {
		w.Header().Set("Retry-After", "1")
		fcmError(w, http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", "Quota exceeded for quota metric 'Send messages'.")
		return
	}
	switch t := req.Message.Token; {
	case strings.HasPrefix(t, "gone"):
		p.count(func(s *Stats) { s.Rejected++ })
		fcmError(w, http.StatusNotFound, "NOT_FOUND", "UNREGISTERED", "Requested entity was not found.")
		return
	case strings.HasPrefix(t, "bad"):
		p.count(func(s *Stats) { s.Rejected++ })
		fcmError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token")
		return
	}
	id := p.delivered(req.Message.Token)
	writeJSON(w, http.StatusOK, map[string]string{"name": "projects/" + p.cfg.ProjectID + "/messages/" + id})
}

// fcmToken is the OAuth2 token endpoint for the JWT-bearer grant: it
// checks the assertion's RS256 signature against the service account's
// key and issues an access token.
func (p *Provider) fcmToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	if r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" || verifyRS256(r.PostForm.Get("assertion"), &p.rsaKey.PublicKey) != nil {
		p.count(func(s *Stats) { s.Unauthorized++ })
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
		return
	}
	buf := make([]byte, 18)
	_, _ = rand.Read(buf)
	tok := "ya29.mock-" + base64.RawURLEncoding.EncodeToString(buf)
	p.mu.Lock()
	p.tokens[tok] = p.cfg.Now().Add(p.cfg.TokenTTL)
	p.stats.Tokens++
	p.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": int(p.cfg.TokenTTL / time.Second)})
}

func verifyRS256(jwt string, pub *rsa.PublicKey) error {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return errors.New("not a JWT")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	return rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig)
}

// --- APNs: https://developer.apple.com/documentation/usernotifications/sending-notification-requests-to-apns

func apnsError(w http.ResponseWriter, status int, reason string) {
	writeJSON(w, status, map[string]any{"reason": reason})
}

func (p *Provider) apns(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 2 {
		http.Error(w, "APNs requires HTTP/2", http.StatusHTTPVersionNotSupported)
		return
	}
	token, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
	if r.Method != http.MethodPost || !ok || token == "" {
		apnsError(w, http.StatusNotFound, "BadPath")
		return
	}
	jwt, _ := strings.CutPrefix(r.Header.Get("Authorization"), "bearer ")
	if jwt == "" {
		p.count(func(s *Stats) { s.Unauthorized++ })
		apnsError(w, http.StatusForbidden, "MissingProviderToken")
		return
	}
	kid, team, issued, err := httpsink.VerifyES256(jwt, &p.ecKey.PublicKey)
	if err != nil || kid != p.cfg.KeyID || team != p.cfg.TeamID {
		p.count(func(s *Stats) { s.Unauthorized++ })
		apnsError(w, http.StatusForbidden, "InvalidProviderToken")
		return
	}
	if p.cfg.Now().Sub(issued) > time.Hour {
		p.count(func(s *Stats) { s.Unauthorized++ })
		apnsError(w, http.StatusForbidden, "ExpiredProviderToken")
		return
	}
	if r.Header.Get("apns-topic") == "" {
		p.count(func(s *Stats) { s.Rejected++ })
		apnsError(w, http.StatusBadRequest, "MissingTopic")
		return
	}
	var payload map[string]any
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if json.Unmarshal(body, &payload) != nil || payload["aps"] == nil {
		p.count(func(s *Stats) { s.Rejected++ })
		apnsError(w, http.StatusBadRequest, "PayloadEmpty")
		return
	}
	if !p.admit() {
		apnsError(w, http.StatusTooManyRequests, "TooManyRequests")
		return
	}
	switch {
	case strings.HasPrefix(token, "gone"):
		p.count(func(s *Stats) { s.Rejected++ })
		writeJSON(w, http.StatusGone, map[string]any{"reason": "Unregistered", "timestamp": p.cfg.Now().UnixMilli()})
		return
	case strings.HasPrefix(token, "bad"):
		p.count(func(s *Stats) { s.Rejected++ })
		apnsError(w, http.StatusBadRequest, "BadDeviceToken")
		return
	}
	id := p.delivered(token)
	w.Header().Set("apns-id", "00000000-0000-0000-0000-0000"+id)
	w.WriteHeader(http.StatusOK)
}

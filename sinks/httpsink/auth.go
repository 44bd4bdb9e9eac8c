package httpsink

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
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
	"math/big"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"golang.org/x/oauth2/jwt"

	"github.com/throttlehq/throttle/internal/redact"
)

// Authorizer adds credentials to each request just before it is sent: a
// header, a form field, a token fetched and refreshed in the background.
// Authorize must be safe for concurrent use and must never put a secret
// into an error it returns.
type Authorizer interface {
	Authorize(ctx context.Context, req *http.Request) error
}

// Checker is an Authorizer that can verify its credentials before the
// first message, so that wrong credentials fail at start-up. Sink.Check
// calls it.
type Checker interface {
	Check(ctx context.Context) error
}

// basicAuth sets HTTP basic authentication.
type basicAuth struct{ user, password string }

func (b basicAuth) Authorize(_ context.Context, req *http.Request) error {
	req.SetBasicAuth(b.user, b.password)
	return nil
}

// formAuth appends form fields (the legacy Vonage SMS API's api_key and
// api_secret) to a form-encoded body.
type formAuth struct{ fields url.Values }

func (f formAuth) Authorize(_ context.Context, req *http.Request) error {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return fmt.Errorf("reading the request body: %w", err)
		}
		_ = req.Body.Close()
	}
	if len(body) > 0 {
		body = append(body, '&')
	}
	body = append(body, f.fields.Encode()...)
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
	return nil
}

// FCMScope is the OAuth2 scope the FCM HTTP v1 API requires.
const FCMScope = "https://www.googleapis.com/auth/firebase.messaging"

// DefaultTokenRefresh is how long before its expiry an OAuth2 access token
// is replaced.
const DefaultTokenRefresh = 5 * time.Minute

// oauthAuth sets "Authorization: Bearer" with an access token from a
// Google service account, fetched on first use and replaced early: once a
// token is within refresh of its expiry, the next request fetches a new
// one. If that fetch fails while the old token is still valid, the old one
// is used and the next request tries again.
type oauthAuth struct {
	conf    *jwt.Config
	client  *http.Client // for the token endpoint
	refresh time.Duration
	now     func() time.Time

	mu  sync.Mutex
	tok *oauth2.Token
}

// newOAuthAuth reads a service-account JSON key. It returns the project
// id the key names, for the FCM URL.
func newOAuthAuth(keyJSON []byte, client *http.Client) (*oauthAuth, string, error) {
	var f struct {
		Type        string `json:"type"`
		ProjectID   string `json:"project_id"`
		PrivateKey  string `json:"private_key"`
		ClientEmail string `json:"client_email"`
	}
	if err := json.Unmarshal(keyJSON, &f); err != nil {
		return nil, "", errors.New("not a JSON service-account key")
	}
	if f.Type != "service_account" {
		return nil, "", fmt.Errorf("key type %q is not service_account", f.Type)
	}
	conf, err := google.JWTConfigFromJSON(keyJSON, FCMScope)
	if err == nil && (f.ClientEmail == "" || !rsaKeyPEM(f.PrivateKey)) {
		err = errors.New("incomplete key")
	}
	if err != nil {
		// The oauth2 error can quote the key file; keep only its kind.
		return nil, "", errors.New("the service-account key has no usable private key or client email")
	}
	return &oauthAuth{conf: conf, client: client, refresh: DefaultTokenRefresh, now: time.Now}, f.ProjectID, nil
}

func (o *oauthAuth) Authorize(ctx context.Context, req *http.Request) error {
	tok, err := o.token(ctx)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	return nil
}

// Check fetches a token, so that a bad key fails at start-up.
//
// Only a refusal by the token endpoint fails the check: an endpoint that
// cannot be reached at start-up is no reason to refuse to start, and every
// send tries again.
func (o *oauthAuth) Check(ctx context.Context) error {
	_, err := o.token(ctx)
	if errors.Is(err, errTokenRefused) {
		return err
	}
	return nil
}

// errTokenRefused marks a token endpoint's answer that refuses the key.
var errTokenRefused = errors.New("the token endpoint refused the service-account key")

func (o *oauthAuth) token(ctx context.Context) (*oauth2.Token, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	if o.tok != nil && (o.tok.Expiry.IsZero() || now.Before(o.tok.Expiry.Add(-o.refresh))) {
		return o.tok, nil
	}
	// A fresh TokenSource each time: the one jwt.Config returns caches
	// its token until 10 s before expiry, later than we want.
	tok, err := o.conf.TokenSource(context.WithValue(ctx, oauth2.HTTPClient, o.client)).Token()
	if err != nil {
		if o.tok != nil && now.Before(o.tok.Expiry) {
			return o.tok, nil
		}
		return nil, fmt.Errorf("fetching an OAuth2 access token from %s: %w", redactURL(o.conf.TokenURL), tokenError(err))
	}
	// Expiry on our clock: the oauth2 package stamps it with time.Now.
	if !tok.Expiry.IsZero() {
		tok.Expiry = now.Add(time.Until(tok.Expiry))
	}
	o.tok = tok
	return tok, nil
}

// rsaKeyPEM reports whether s is a PEM RSA private key (PKCS #8 or #1).
func rsaKeyPEM(s string) bool {
	block, _ := pem.Decode([]byte(s))
	if block == nil {
		return false
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		_, ok := k.(*rsa.PrivateKey)
		return ok
	}
	_, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	return err == nil
}

// tokenError keeps what an operator needs from a token endpoint's refusal
// (its status and error code) and drops the rest.
func tokenError(err error) error {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		code := re.ErrorCode
		if code == "" {
			var body struct {
				Error string `json:"error"`
			}
			if json.Unmarshal(re.Body, &body) == nil {
				code = body.Error
			}
		}
		if code == "" {
			code = "no error code"
		}
		status := ""
		if re.Response != nil {
			status = re.Response.Status
		}
		return fmt.Errorf("%w: it answered %s (%s)", errTokenRefused, status, code)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}

func redactURL(s string) string {
	return cmp.Or(redact.Endpoint(s), "the token endpoint")
}

// APNs provider tokens: APNs rejects a token older than an hour and
// answers TooManyProviderTokenUpdates when a token is replaced more often
// than every 20 minutes. The sink replaces its token after
// DefaultAPNsTokenAge.
const (
	MinAPNsTokenAge     = 20 * time.Minute
	MaxAPNsTokenAge     = 60 * time.Minute
	DefaultAPNsTokenAge = 40 * time.Minute
)

// apnsAuth signs APNs provider tokens: JWTs with ES256, the key id in the
// header and the team id and issue time in the claims, each reused for
// maxAge.
type apnsAuth struct {
	key    *ecdsa.PrivateKey
	keyID  string
	teamID string
	maxAge time.Duration
	now    func() time.Time

	mu     sync.Mutex
	token  string
	issued time.Time
}

// newAPNsAuth parses a PKCS #8 PEM key (the .p8 file Apple issues).
func newAPNsAuth(keyPEM []byte, keyID, teamID string) (*apnsAuth, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("the key file holds no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, errors.New("the key file holds no PKCS #8 private key")
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || ek.Curve.Params().BitSize != 256 {
		return nil, errors.New("the key is not an ECDSA P-256 key, as ES256 requires")
	}
	switch {
	case keyID == "":
		return nil, errors.New("the key id is required")
	case teamID == "":
		return nil, errors.New("the team id is required")
	}
	return &apnsAuth{key: ek, keyID: keyID, teamID: teamID, maxAge: DefaultAPNsTokenAge, now: time.Now}, nil
}

func (a *apnsAuth) Authorize(_ context.Context, req *http.Request) error {
	tok, err := a.current()
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "bearer "+tok)
	return nil
}

// current returns the token, signing a new one when there is none or the
// old one reached maxAge.
func (a *apnsAuth) current() (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if a.token != "" && now.Sub(a.issued) < a.maxAge {
		return a.token, nil
	}
	tok, err := signES256(a.key, a.keyID, a.teamID, now)
	if err != nil {
		return "", err
	}
	a.token, a.issued = tok, now
	return tok, nil
}

// signES256 makes a JWT: base64url(header).base64url(claims).base64url(r||s).
func signES256(key *ecdsa.PrivateKey, keyID, teamID string, now time.Time) (string, error) {
	header, _ := json.Marshal(map[string]string{"alg": "ES256", "kid": keyID})
	claims, _ := json.Marshal(map[string]any{"iss": teamID, "iat": now.Unix()})
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString(header) + "." + enc.EncodeToString(claims)
	sum := sha256.Sum256([]byte(signing))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		return "", fmt.Errorf("signing the APNs provider token: %w", err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signing + "." + enc.EncodeToString(sig), nil
}

// VerifyES256 checks a JWT made by an APNs provider and returns its key
// id, team id and issue time. It exists for mock servers and tests.
func VerifyES256(token string, pub *ecdsa.PublicKey) (keyID, teamID string, issued time.Time, err error) {
	parts := bytes.Split([]byte(token), []byte("."))
	if len(parts) != 3 {
		return "", "", time.Time{}, errors.New("not a JWT")
	}
	enc := base64.RawURLEncoding
	sig, err := enc.DecodeString(string(parts[2]))
	if err != nil || len(sig) != 64 {
		return "", "", time.Time{}, errors.New("bad signature encoding")
	}
	sum := sha256.Sum256(bytes.Join(parts[:2], []byte(".")))
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(pub, sum[:], r, s) {
		return "", "", time.Time{}, errors.New("bad signature")
	}
	var h struct{ Alg, Kid string }
	var c struct {
		Iss string
		Iat json.Number
	}
	hb, _ := enc.DecodeString(string(parts[0]))
	cb, _ := enc.DecodeString(string(parts[1]))
	if json.Unmarshal(hb, &h) != nil || json.Unmarshal(cb, &c) != nil || h.Alg != "ES256" {
		return "", "", time.Time{}, errors.New("bad header or claims")
	}
	iat, err := strconv.ParseInt(c.Iat.String(), 10, 64)
	if err != nil {
		return "", "", time.Time{}, errors.New("bad iat claim")
	}
	return h.Kid, c.Iss, time.Unix(iat, 0), nil
}

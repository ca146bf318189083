package outboxui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Authenticator names the user of a request, or returns an error when it has none the console
// accepts. The error's text is not shown to the client. An application mounting the console plugs
// its own authentication in here (a session cookie, a header set by its proxy).
type Authenticator func(r *http.Request) (user string, err error)

// ErrUnauthenticated is what the Authenticators of this package return (wrapped) for a request
// without valid credentials.
var ErrUnauthenticated = errors.New("outboxui: unauthenticated")

// challenger is an authentication error that says how to authenticate: the WWW-Authenticate value of
// the 401.
type challenger interface{ challenge() string }

// refused is the error of BasicAuth and BearerToken: ErrUnauthenticated, with their challenge.
type refused struct{ scheme string }

func (e refused) Error() string        { return ErrUnauthenticated.Error() }
func (e refused) Is(target error) bool { return target == ErrUnauthenticated }
func (e refused) challenge() string    { return e.scheme + ` realm="outbox", charset="UTF-8"` }

var (
	basicRefused  = refused{"Basic"}
	bearerRefused = refused{"Bearer"}
)

// BasicAuth accepts HTTP basic authentication by the users of users (name → password). Passwords
// are compared in constant time. The browser asks for them: the console answers a request without
// them with 401 and a WWW-Authenticate challenge.
func BasicAuth(users map[string]string) Authenticator {
	creds := make(map[string]string, len(users))
	for u, p := range users {
		creds[u] = p
	}
	return func(r *http.Request) (string, error) {
		user, pass, ok := r.BasicAuth()
		if !ok {
			return "", basicRefused
		}
		want, known := creds[user]
		// Compared even for an unknown user, so that the time does not tell which users exist.
		match := subtle.ConstantTimeCompare([]byte(pass), []byte(want)) == 1
		if !known || !match || want == "" {
			return "", basicRefused
		}
		return user, nil
	}
}

// BearerToken accepts "Authorization: Bearer <token>" for the tokens of tokens (token → the user
// it stands for, as the log names it).
func BearerToken(tokens map[string]string) Authenticator {
	type entry struct{ token, user string }
	var known []entry
	for t, u := range tokens {
		if t != "" {
			known = append(known, entry{t, u})
		}
	}
	return func(r *http.Request) (string, error) {
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			return "", bearerRefused
		}
		user := ""
		for _, e := range known { // every token compared, in constant time
			if subtle.ConstantTimeCompare([]byte(token), []byte(e.token)) == 1 {
				user = e.user
			}
		}
		if user == "" {
			return "", bearerRefused
		}
		return user, nil
	}
}

// csrf signs and checks the console's CSRF tokens: a random value in a cookie of the console
// (HttpOnly, SameSite=Strict), and its HMAC in every form. A POST whose form token is not the HMAC of
// its cookie is refused. Another site can make a browser send the cookie, but cannot read it or the
// page's token; on top of this, net/http's CrossOriginProtection refuses cross-origin POSTs that the
// browser marks as such (Sec-Fetch-Site, Origin).
type csrf struct {
	key []byte
}

const csrfCookie = "outboxui_csrf"

func newCSRF(key []byte) (*csrf, error) {
	if key == nil {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("outboxui: CSRF key: %w", err)
		}
	}
	return &csrf{key: key}, nil
}

// token returns the form token of the request's cookie, setting a new cookie when it has none.
func (c *csrf) token(w http.ResponseWriter, r *http.Request, path string) string {
	value := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 43 {
		value = ck.Value
	} else {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		value = base64.RawURLEncoding.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: value, Path: path, HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	}
	return c.sign(value)
}

func (c *csrf) sign(value string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("outboxui csrf\x00" + value))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// check reports whether the form token of r matches its cookie.
func (c *csrf) check(r *http.Request) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || ck.Value == "" {
		return false
	}
	got := r.PostFormValue("csrf")
	return got != "" && hmac.Equal([]byte(got), []byte(c.sign(ck.Value)))
}

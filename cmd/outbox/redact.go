package main

import (
	"net/url"
	"regexp"
	"strings"

	"github.com/go-sql-driver/mysql"
)

const redacted = "xxxxx"

var (
	// scheme://user:pass@ (the user too: it is half of the credentials, and cheap to leave out).
	urlCredsRE = regexp.MustCompile(`(?i)([a-z][a-z0-9+.-]*://)[^/@\s]*@`)
	// user:pass@ of a go-sql-driver DSN, starting a word (a password starting with / is the rest of
	// a URL, which urlCredsRE has done).
	dsnCredsRE = regexp.MustCompile("(^|[\\s\"'`(=\\[])[^\\s:@\"'`/()=\\[]+:(?:[^\\s@/][^\\s@]*)?@")
	// password=... of a key=value DSN, quoted or not.
	kvPasswordRE = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'"]+)`)
)

// redact removes credentials from text that is about to be printed: the password of the DSN in use
// wherever it appears (as written, and URL-encoded), and anything shaped like credentials in a URL,
// a MySQL DSN or a key=value DSN, which a driver's error may echo.
func (a *app) redact(text string) string {
	for _, p := range passwordsOf(a.dsn) {
		text = strings.ReplaceAll(text, p, redacted)
	}
	text = urlCredsRE.ReplaceAllString(text, "${1}"+redacted+"@")
	text = dsnCredsRE.ReplaceAllString(text, "${1}"+redacted+"@")
	return kvPasswordRE.ReplaceAllString(text, "${1}"+redacted)
}

// passwordsOf returns the password of dsn in the forms it may be printed in, or nothing.
func passwordsOf(dsn string) []string {
	var pw string
	if m := kvPasswordRE.FindStringSubmatch(dsn); m != nil {
		pw = strings.Trim(m[2], "'")
	} else if strings.Contains(dsn, "://") {
		if u, err := url.Parse(dsn); err == nil && u.User != nil {
			pw, _ = u.User.Password()
		} else if m := urlCredsRE.FindString(dsn); m != "" { // unparsable: take what lies between : and @
			_, creds, _ := strings.Cut(strings.TrimSuffix(m, "@"), "://")
			_, pw, _ = strings.Cut(creds, ":")
		}
	} else if cfg, err := mysql.ParseDSN(dsn); err == nil {
		pw = cfg.Passwd
	}
	if pw == "" {
		return nil
	}
	return []string{pw, url.QueryEscape(pw), url.PathEscape(pw), url.UserPassword("u", pw).String()[2:]}
}

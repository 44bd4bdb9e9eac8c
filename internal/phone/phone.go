// Package phone normalises telephone numbers to E.164 and places them: the
// country (ISO 3166 region) and the IANA time zones of a number, from
// github.com/nyaruka/phonenumbers (Google's libphonenumber data). Lookups
// are cached, so that a recipient seen again costs a map read.
package phone

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nyaruka/phonenumbers"
)

// ErrNotNumber is wrapped by the error for a string that is not a
// telephone number in international form.
var ErrNotNumber = errors.New("not an international telephone number")

// Info is what a number's digits tell.
type Info struct {
	// E164 is the number as "+" and digits.
	E164 string
	// Region is the number's country, ISO 3166-1 alpha-2 ("US", "FR"), or
	// "" when its prefix is shared by several and the number is not valid
	// in any of them.
	Region string
	// Zones are the IANA time zones of the number's prefix, most specific
	// first as libphonenumber gives them: one for most numbers (US 212 is
	// America/New_York), several for a prefix that covers them (a US toll
	// free number), none when the prefix is not placed.
	Zones []string
}

// Normalize returns s as E.164: "+" and the digits, the separators that
// people write ("+1 (212) 555-0100", "1.212.555.0100") removed and a
// missing "+" (or a leading international "00") supplied, so that every
// way of writing one number gives one string. It fails, wrapping
// ErrNotNumber, for anything else (letters, no country code, too short or
// too long for its country).
func Normalize(s string) (string, error) {
	info, err := Lookup(s)
	if err != nil {
		return "", err
	}
	return info.E164, nil
}

// Lookup normalises s (see Normalize) and places the number. It is safe
// for concurrent use; results are cached by s, up to cacheMax entries
// (then the cache starts over).
func Lookup(s string) (Info, error) {
	cache.mu.RLock()
	e, ok := cache.m[s]
	cache.mu.RUnlock()
	if ok {
		return e.info, e.err
	}
	info, err := lookup(s)
	cache.mu.Lock()
	if len(cache.m) >= cacheMax {
		clear(cache.m)
	}
	cache.m[s] = entry{info, err}
	cache.mu.Unlock()
	return info, err
}

const cacheMax = 1 << 16

type entry struct {
	info Info
	err  error
}

var cache = struct {
	mu sync.RWMutex
	m  map[string]entry
}{m: map[string]entry{}}

// digits returns s as "+" and digits, or "" when s holds anything but
// digits, one leading "+" or "00", and the separators space, '-', '.',
// '(' and ')'.
func digits(s string) string {
	s = strings.TrimSpace(s)
	b := make([]byte, 0, len(s)+1)
	b = append(b, '+')
	switch {
	case strings.HasPrefix(s, "+"):
		s = s[1:]
	case strings.HasPrefix(s, "00"):
		s = s[2:]
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			b = append(b, c)
		case c == ' ' || c == '-' || c == '.' || c == '(' || c == ')' || c == '\t':
		default:
			return ""
		}
	}
	if len(b) < 2 {
		return ""
	}
	return string(b)
}

func lookup(s string) (Info, error) {
	d := digits(s)
	if d == "" || len(d) > 16 {
		return Info{}, fmt.Errorf("%q: %w", s, ErrNotNumber)
	}
	// phonenumbers.Parse is slow (tens of µs, regular expressions); the
	// digits already are in international form, so split off the country
	// code (ITU codes are prefix-free: 1 to 3 digits) and check the rest.
	var cc int
	for n := 1; n <= 3 && n < len(d)-1; n++ {
		c := 0
		for _, ch := range d[1 : 1+n] {
			c = c*10 + int(ch-'0')
		}
		if phonenumbers.GetRegionCodeForCountryCode(c) != phonenumbers.UNKNOWN_REGION {
			cc = c
			break
		}
	}
	if cc == 0 {
		return Info{}, fmt.Errorf("%q: unknown country code: %w", s, ErrNotNumber)
	}
	var national uint64
	nd := d[1+len(fmt.Sprint(cc)):]
	for _, ch := range nd {
		national = national*10 + uint64(ch-'0')
	}
	num := &phonenumbers.PhoneNumber{}
	num.CountryCode = new(int32(cc))
	num.NationalNumber = new(national)
	if strings.HasPrefix(nd, "0") { // Italian leading zero
		num.ItalianLeadingZero = new(true)
	}
	if !phonenumbers.IsPossibleNumber(num) {
		return Info{}, fmt.Errorf("%q: not a possible number for country code %d: %w", s, cc, ErrNotNumber)
	}
	info := Info{E164: phonenumbers.Format(num, phonenumbers.E164)}
	if regions := phonenumbers.GetRegionCodesForCountryCode(cc); len(regions) == 1 {
		info.Region = regions[0]
		if info.Region == "001" { // non-geographic (+800, +882 ...)
			info.Region = ""
		}
	} else if r := phonenumbers.GetRegionCodeForNumber(num); r != phonenumbers.UNKNOWN_REGION {
		info.Region = r
	}
	if zones, err := phonenumbers.GetTimezonesForNumber(num); err == nil {
		for _, z := range zones {
			if z != phonenumbers.UNKNOWN_TIMEZONE {
				info.Zones = append(info.Zones, z)
			}
		}
	}
	return info, nil
}

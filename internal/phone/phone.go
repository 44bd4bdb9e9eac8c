// Package phone normalises telephone numbers to E.164 and places them: the
// country (ISO 3166 region) and the IANA time zones of a number, from
// github.com/nyaruka/phonenumbers (Google's libphonenumber data).
//
// A number already written in E.164 ("+" and digits) is read without
// allocating and without libphonenumber's parser: its country code, its
// length (whether it is possible) and its zones (a prefix table) are table
// look-ups, so a message whose recipient was never seen costs about as
// much as one seen before. Only the country of a number whose country code
// several countries share (+1, +7, +44 ...) runs libphonenumber's patterns;
// Info.Region does that on demand and caches it.
package phone

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nyaruka/phonenumbers"
)

// ErrNotNumber is wrapped by the error for a string that is not a
// telephone number in international form.
var ErrNotNumber = errors.New("not an international telephone number")

// Info is what a number's digits tell.
type Info struct {
	// E164 is the number as "+" and digits.
	E164 string
	// Zones are the IANA time zones of the number's prefix, most specific
	// first as libphonenumber gives them: one for most numbers (US 212 is
	// America/New_York), several for a prefix that covers them (a US toll
	// free number), none when the prefix is not placed. The slice is
	// shared by every number of the prefix: read it, never write to it.
	Zones []string

	cc       int    // the country calling code
	national uint64 // the national number, without leading zeros
	zero     bool   // the national number has a leading zero (Italy)
}

// Region returns the number's country, ISO 3166-1 alpha-2 ("US", "FR"),
// or "" when its country code is shared by several and the number is not
// valid in any of them, or is not geographic (+800, +882 ...). For a
// shared country code it runs libphonenumber's validation (tens of µs),
// once per number: results are cached, up to cacheMax numbers (then the
// cache starts over). Safe for concurrent use; "" for the zero Info.
func (i Info) Region() string {
	if i.cc == 0 {
		return ""
	}
	regions := phonenumbers.GetRegionCodesForCountryCode(i.cc)
	if len(regions) == 1 {
		if regions[0] == "001" { // non-geographic
			return ""
		}
		return regions[0]
	}
	regionCache.mu.RLock()
	r, ok := regionCache.m[i.E164]
	regionCache.mu.RUnlock()
	if ok {
		return r
	}
	r = regionOf(i.cc, i.E164[len(i.E164)-i.nsnLen():])
	regionCache.mu.Lock()
	if len(regionCache.m) >= cacheMax {
		clear(regionCache.m)
	}
	regionCache.m[i.E164] = r
	regionCache.mu.Unlock()
	return r
}

// ByCountry returns m's value for the number's country (Region) and
// whether m holds one, as m[i.Region()] does, but runs the country's
// validation only when m could hold it: when m has a value for one of the
// countries that share the number's country code. So a window with a
// calendar for France reads a US number's country for nothing. Safe for
// concurrent use (m is only read).
func ByCountry[V any](i Info, m map[string]V) (V, bool) {
	if len(m) == 0 {
		var zero V
		return zero, false
	}
	if _, unplaced := m[""]; !unplaced {
		candidates := phonenumbers.GetRegionCodesForCountryCode(i.cc)
		if !slices.ContainsFunc(candidates, func(r string) bool { _, ok := m[r]; return ok }) {
			var zero V
			return zero, false
		}
	}
	v, ok := m[i.Region()]
	return v, ok
}

// nsnLen is the length of the national significant number: the national
// number's digits, after a leading zero when it has one.
func (i Info) nsnLen() int {
	n := 1
	for v := i.national; v >= 10; v /= 10 {
		n++
	}
	if i.zero {
		n++
	}
	return n
}

// number is i as libphonenumber's type.
func (i Info) number() *phonenumbers.PhoneNumber {
	num := &phonenumbers.PhoneNumber{}
	num.CountryCode = new(int32(i.cc))
	num.NationalNumber = new(i.national)
	if i.zero { // Italian leading zero
		num.ItalianLeadingZero = new(true)
	}
	return num
}

// cacheMax bounds the region cache.
const cacheMax = 1 << 16

var regionCache = struct {
	mu sync.RWMutex
	m  map[string]string // E.164 → region
}{m: map[string]string{}}

// Normalize returns s as E.164: "+" and the digits, the separators that
// people write ("+1 (212) 555-0100", "1.212.555.0100") removed and a
// missing "+" (or a leading international "00") supplied, so that every
// way of writing one number gives one string. It fails, wrapping
// ErrNotNumber, for anything else (letters, no country code, too short or
// too long for its country). It returns s itself, without allocating,
// when s already is E.164. Safe for concurrent use.
func Normalize(s string) (string, error) {
	info, err := parse(s)
	if err != nil {
		return "", err
	}
	return info.E164, nil
}

// Lookup normalises s (see Normalize) and places the number (its zones;
// its country is Info.Region). It is safe for concurrent use, and does
// not allocate when s already is E.164.
func Lookup(s string) (Info, error) {
	info, err := parse(s)
	if err != nil {
		return Info{}, err
	}
	// What phonenumbers.GetTimezonesForNumber does: its E.164 looked up
	// in the prefix table.
	if zones, err := phonenumbers.GetTimezonesForPrefix(info.E164); err == nil {
		info.Zones = placed(zones)
	}
	return info, nil
}

// parse is Lookup without the zones.
func parse(s string) (Info, error) {
	d := s
	if !isE164(s) {
		if d = digits(s); d == "" {
			return Info{}, fmt.Errorf("%q: %w", s, ErrNotNumber)
		}
	}
	if len(d) > 16 {
		return Info{}, fmt.Errorf("%q: %w", s, ErrNotNumber)
	}
	// phonenumbers.Parse is slow (tens of µs, regular expressions); the
	// digits already are in international form, so split off the country
	// code (ITU codes are prefix-free: 1 to 3 digits) and check the rest.
	cc, n := 0, 0
	for n = 1; n <= 3 && n < len(d)-1; n++ {
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
	var info Info
	info.cc = cc
	// The country code's digits are n, unless they started with a zero
	// ("+01" reads as code 1): then the national number starts after as
	// many digits as the code has.
	if d[1] == '0' {
		n = len(strconv.Itoa(cc))
	}
	nd := d[1+n:]
	for _, ch := range nd {
		info.national = info.national*10 + uint64(ch-'0')
	}
	info.zero = strings.HasPrefix(nd, "0")
	if d[1] != '0' && !info.zero {
		// libphonenumber's E.164 is "+", the code and the national
		// number's decimal digits: d itself, since neither the code nor
		// the national number starts with a zero
		// (TestLookupMatchesLibrary).
		if !possible(cc, len(nd)) {
			return Info{}, fmt.Errorf("%q: not a possible number for country code %d: %w", s, cc, ErrNotNumber)
		}
		info.E164 = d
	} else {
		num := info.number()
		if !phonenumbers.IsPossibleNumber(num) {
			return Info{}, fmt.Errorf("%q: not a possible number for country code %d: %w", s, cc, ErrNotNumber)
		}
		info.E164 = phonenumbers.Format(num, phonenumbers.E164)
	}
	return info, nil
}

// isE164 reports whether s is "+" and at least one digit, nothing else.
func isE164(s string) bool {
	if len(s) < 2 || s[0] != '+' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// possible reports phonenumbers.IsPossibleNumber for a number of country
// code cc whose national significant number has n digits: the library
// decides it by the length alone, so the answer is kept per code and
// length.
func possible(cc, n int) bool {
	if cc >= len(possibleCache) || n >= len(possibleCache[0]) {
		return possibleSlow(cc, n)
	}
	p := &possibleCache[cc][n]
	switch p.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	ok := possibleSlow(cc, n)
	if ok {
		p.Store(1)
	} else {
		p.Store(2)
	}
	return ok
}

// possibleCache holds possible's answers: 0 not known yet, 1 possible,
// 2 not.
var possibleCache [1000][18]atomic.Uint32

// possibleSlow asks the library about a number of n digits, 1 and zeros
// (the digits do not matter to it).
func possibleSlow(cc, n int) bool {
	if n < 1 || n > 17 {
		return false
	}
	var national uint64 = 1
	for range n - 1 {
		national *= 10
	}
	return phonenumbers.IsPossibleNumber(Info{cc: cc, national: national}.number())
}

// placed returns zones without libphonenumber's unknown zone, the same
// slice when it has none (the usual case), else a copy made once per
// slice.
func placed(zones []string) []string {
	if !slices.Contains(zones, phonenumbers.UNKNOWN_TIMEZONE) {
		return zones
	}
	if !slices.ContainsFunc(zones, func(z string) bool { return z != phonenumbers.UNKNOWN_TIMEZONE }) {
		return nil // not placed (the library's fresh list of the unknown zone)
	}
	key := &zones[0]
	if v, ok := placedCache.Load(key); ok {
		return v.([]string)
	}
	var out []string
	for _, z := range zones {
		if z != phonenumbers.UNKNOWN_TIMEZONE {
			out = append(out, z)
		}
	}
	placedCache.Store(key, out)
	return out
}

// placedCache maps the first element of a zone list of the library's
// table (which lives as long as the program) to that list without the
// unknown zone.
var placedCache sync.Map

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

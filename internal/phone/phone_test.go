package phone

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nyaruka/phonenumbers"
)

func TestLookup(t *testing.T) {
	for _, c := range []struct {
		in, e164, region string
		zones            []string
	}{
		{"+1 (212) 555-0100", "+12125550100", "US", []string{"America/New_York"}},
		{"12125550100", "+12125550100", "US", []string{"America/New_York"}},
		{"+14155550100", "+14155550100", "US", []string{"America/Los_Angeles"}},
		{"0033 6 12 34 56 78", "+33612345678", "FR", []string{"Europe/Paris"}},
		{"+44 20 7946 0000", "+442079460000", "GB", []string{"Europe/London"}},
		{"+61 2 1234 5678", "+61212345678", "AU", []string{"Australia/Sydney"}},
		{"+39 06 1234 5678", "+390612345678", "IT", []string{"Europe/Rome"}},
	} {
		got, err := Lookup(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if got.E164 != c.e164 || got.Region() != c.region || !slices.Equal(got.Zones, c.zones) {
			t.Errorf("%q: got %+v, want %s %s %v", c.in, got, c.e164, c.region, c.zones)
		}
	}
	// A US toll-free number is placed in every US zone.
	if got, err := Lookup("+18005550100"); err != nil || len(got.Zones) < 5 {
		t.Errorf("toll free: %+v %v", got, err)
	}
	for _, bad := range []string{"", "abc", "+", "+99912345", "+1 212", "+1212555010012345", "tel:+12125550100"} {
		if _, err := Lookup(bad); !errors.Is(err, ErrNotNumber) {
			t.Errorf("%q: got %v, want ErrNotNumber", bad, err)
		}
	}
}

func BenchmarkLookupUncached(b *testing.B) {
	for i := range b.N {
		if _, err := Lookup("+1212555" + string(rune('0'+i%10)) + "100"); err != nil {
			b.Fatal(err)
		}
	}
}

// reference is Lookup as libphonenumber's own functions give it, with no
// shortcut: the number built from the digits, IsPossibleNumber, Format,
// GetRegionCodeForNumber and GetTimezonesForNumber. Lookup must agree
// with it on every input.
func reference(s string) (e164, region string, zones []string, err error) {
	d := digits(s)
	if d == "" || len(d) > 16 {
		return "", "", nil, ErrNotNumber
	}
	var cc int
	for n := 1; n <= 3 && n < len(d)-1; n++ {
		c, _ := strconv.Atoi(d[1 : 1+n])
		if phonenumbers.GetRegionCodeForCountryCode(c) != phonenumbers.UNKNOWN_REGION {
			cc = c
			break
		}
	}
	if cc == 0 {
		return "", "", nil, ErrNotNumber
	}
	nd := d[1+len(strconv.Itoa(cc)):]
	national, _ := strconv.ParseUint(nd, 10, 64)
	num := &phonenumbers.PhoneNumber{CountryCode: new(int32(cc)), NationalNumber: new(national)}
	if strings.HasPrefix(nd, "0") {
		num.ItalianLeadingZero = new(true)
	}
	if !phonenumbers.IsPossibleNumber(num) {
		return "", "", nil, ErrNotNumber
	}
	e164 = phonenumbers.Format(num, phonenumbers.E164)
	if regions := phonenumbers.GetRegionCodesForCountryCode(cc); len(regions) == 1 {
		region = regions[0]
		if region == "001" {
			region = ""
		}
	} else if r := phonenumbers.GetRegionCodeForNumber(num); r != phonenumbers.UNKNOWN_REGION {
		region = r
	}
	if zs, zerr := phonenumbers.GetTimezonesForNumber(num); zerr == nil {
		for _, z := range zs {
			if z != phonenumbers.UNKNOWN_TIMEZONE {
				zones = append(zones, z)
			}
		}
	}
	return e164, region, zones, nil
}

// sample returns numbers to compare Lookup with the library on: every
// NANP area code with exchanges of each first digit, the end-to-end
// benchmark's numbers, each supported region's example numbers of every
// type (as E.164, with separators, with a digit changed, a digit more and
// a digit fewer, with a leading zero), and random digits after every
// country code.
func sample() []string {
	rng := rand.New(rand.NewPCG(1, 2))
	var out []string
	for area := 200; area <= 999; area++ {
		for ex := range 10 {
			out = append(out, fmt.Sprintf("+1%03d%d%02d%04d", area, ex, rng.IntN(100), rng.IntN(10000)))
		}
		out = append(out, fmt.Sprintf("+1%03d%03d%03d", area, rng.IntN(1000), rng.IntN(1000)), // 9 digits
			fmt.Sprintf("1 (%03d) 555-%04d", area, rng.IntN(10000)))
	}
	for i := range 2000 {
		out = append(out, fmt.Sprintf("+15550%06d", i*499))
	}
	types := []phonenumbers.PhoneNumberType{
		phonenumbers.FIXED_LINE, phonenumbers.MOBILE, phonenumbers.TOLL_FREE, phonenumbers.PREMIUM_RATE,
		phonenumbers.SHARED_COST, phonenumbers.VOIP, phonenumbers.PERSONAL_NUMBER, phonenumbers.PAGER,
		phonenumbers.UAN, phonenumbers.VOICEMAIL,
	}
	var examples []*phonenumbers.PhoneNumber
	for _, r := range slices.Sorted(maps.Keys(phonenumbers.GetSupportedRegions())) {
		for _, t := range types {
			if n := phonenumbers.GetExampleNumberForType(r, t); n != nil {
				examples = append(examples, n)
			}
		}
	}
	for _, cc := range slices.Sorted(maps.Keys(phonenumbers.GetSupportedGlobalNetworkCallingCodes())) {
		if n := phonenumbers.GetExampleNumberForNonGeoEntity(cc); n != nil {
			examples = append(examples, n)
		}
	}
	for _, n := range examples {
		e := phonenumbers.Format(n, phonenumbers.E164)
		cc := strconv.Itoa(int(n.GetCountryCode()))
		nsn := e[1+len(cc):]
		changed := []byte(e)
		changed[len(changed)-1-rng.IntN(len(nsn))] = byte('0' + rng.IntN(10))
		out = append(out, e, phonenumbers.Format(n, phonenumbers.INTERNATIONAL), "00"+e[1:], string(changed),
			e+strconv.Itoa(rng.IntN(10)), e[:len(e)-1], "+"+cc+"0"+nsn, "+"+cc+"00"+nsn)
	}
	// The countries of a shared code by their example numbers with the
	// last digits drawn at random: mostly valid numbers, in each of them.
	for _, n := range examples {
		if len(phonenumbers.GetRegionCodesForCountryCode(int(n.GetCountryCode()))) < 2 {
			continue
		}
		e := []byte(phonenumbers.Format(n, phonenumbers.E164))
		for k := 1; k <= 6 && k < len(e)-4; k++ {
			for range 5 {
				for i := len(e) - k; i < len(e); i++ {
					e[i] = byte('0' + rng.IntN(10))
				}
				out = append(out, string(e))
			}
		}
	}
	for cc := 1; cc < 1000; cc++ {
		if phonenumbers.GetRegionCodeForCountryCode(cc) == phonenumbers.UNKNOWN_REGION {
			continue
		}
		for n := 1; n <= 14; n++ {
			d := make([]byte, n)
			for i := range d {
				d[i] = byte('0' + rng.IntN(10))
			}
			out = append(out, "+"+strconv.Itoa(cc)+string(d))
		}
	}
	return out
}

// TestLookupMatchesLibrary checks Lookup (its shortcuts: an E.164 input
// read as it is, possibility by length, zones by prefix, the country only
// on demand) against libphonenumber's own functions on a large sample:
// the same error or none, E.164, country and zones.
func TestLookupMatchesLibrary(t *testing.T) {
	nums := sample()
	fails, ok := 0, 0
	for _, s := range nums {
		e164, region, zones, rerr := reference(s)
		got, err := Lookup(s)
		if (err != nil) != (rerr != nil) {
			t.Errorf("%q: error %v, library %v", s, err, rerr)
			fails++
		} else if err == nil {
			ok++
			if got.E164 != e164 || got.Region() != region || !slices.Equal(got.Zones, zones) {
				t.Errorf("%q: got %s %q %v, library %s %q %v", s, got.E164, got.Region(), got.Zones, e164, region, zones)
				fails++
			}
			if isE164(s) && e164 == s && got.E164 != s {
				t.Errorf("%q: not itself", s)
			}
		}
		if fails > 20 {
			t.Fatal("too many differences")
		}
	}
	if ok < len(nums)/3 {
		t.Errorf("only %d of %d numbers parse: the sample tests little", ok, len(nums))
	}
	t.Logf("%d numbers, %d placed", len(nums), ok)
}

// TestLookupE164NoAllocs: a number already in E.164 is read without an
// allocation, its country included when its country code is its own.
func TestLookupE164NoAllocs(t *testing.T) {
	for _, s := range []string{"+15550000123", "+12125550100", "+33612345678"} {
		Lookup(s) // the tables, once
		if n := testing.AllocsPerRun(100, func() {
			info, err := Lookup(s)
			if err != nil || info.E164 != s {
				t.Fatal(info, err)
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations", s, n)
		}
	}
	info, _ := Lookup("+33612345678")
	if n := testing.AllocsPerRun(100, func() { _ = info.Region() }); n != 0 {
		t.Errorf("Region of a French number: %v allocations", n)
	}
}

// TestByCountry: ByCountry gives what m[Region()] gives, for maps that
// hold a country of a shared code, one of a code of its own, several, the
// unplaced "" and none, on the sample of TestLookupMatchesLibrary.
func TestByCountry(t *testing.T) {
	tables := []map[string]int{
		nil, {"FR": 1}, {"US": 1}, {"CA": 1, "FR": 2}, {"JE": 1}, {"GB": 1, "KZ": 2}, {"": 1}, {"VI": 1, "PR": 2},
	}
	n := 0
	for _, s := range sample() {
		info, err := Lookup(s)
		if err != nil {
			continue
		}
		for _, m := range tables {
			want, wantOK := m[info.Region()]
			if got, ok := ByCountry(info, m); got != want || ok != wantOK {
				t.Errorf("%s in %v: got %d %v, want %d %v", s, m, got, ok, want, wantOK)
			}
			n++
		}
	}
	if _, ok := ByCountry(Info{}, map[string]int{"US": 1}); ok {
		t.Error("the zero Info has a country")
	}
	t.Logf("%d look-ups", n)
}

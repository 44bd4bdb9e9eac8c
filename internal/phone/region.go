package phone

import (
	"regexp"
	"slices"
	"sync"

	"github.com/nyaruka/phonenumbers"
)

// regionOf returns the country of a number of country code cc whose
// national significant number is nsn, when several countries share cc:
// what phonenumbers.GetRegionCodeForNumber returns ("" for its unknown
// region), by the same steps over the same metadata, with each pattern
// compiled once. The library builds each pattern's "^(?:...)$" string
// (kilobytes for the US fixed lines) and finds its compiled form in a map
// under one lock, for each of up to 25 countries a number is tried
// against. TestLookupMatchesLibrary and TestByCountry hold the two equal.
func regionOf(cc int, nsn string) string {
	tests := regionTestsOf(cc)
	if tests == nil { // metadata not found: the library itself
		if r := phonenumbers.GetRegionCodeForNumber(numberOf(cc, nsn)); r != phonenumbers.UNKNOWN_REGION {
			return r
		}
		return ""
	}
	for _, t := range tests {
		if t.leading != nil {
			if t.leading.MatchString(nsn) {
				return t.region
			}
		} else if t.valid(nsn) {
			return t.region
		}
	}
	return ""
}

// numberOf is the number of country code cc and national significant
// number nsn.
func numberOf(cc int, nsn string) *phonenumbers.PhoneNumber {
	var national uint64
	for _, ch := range nsn {
		national = national*10 + uint64(ch-'0')
	}
	return Info{cc: cc, national: national, zero: len(nsn) > 0 && nsn[0] == '0'}.number()
}

// regionTest is one country of a shared country code, as the library's
// getRegionCodeForNumberFromRegionList tries it: by its leading digits
// when its metadata has them, else by a full validation
// (getNumberTypeHelper not UNKNOWN).
type regionTest struct {
	region  string
	leading *regexp.Regexp // "^(?:leading digits)"
	general desc
	// other are the types tried before the fixed lines: premium rate,
	// toll free, shared cost, VoIP, personal, pager, UAN, voicemail.
	other         []desc
	fixed, mobile desc
	sameFixedMob  bool // the metadata's sameMobileAndFixedLinePattern
}

// desc is a PhoneNumberDesc: isNumberMatchingDesc is true when the
// number's length is one of lengths (or lengths is empty) and the whole
// number matches re.
type desc struct {
	lengths []int32
	re      *regexp.Regexp // nil: the library's desc is nil, nothing matches
}

func (d desc) matches(nsn string) bool {
	if d.re == nil {
		return false
	}
	if len(d.lengths) > 0 && !slices.Contains(d.lengths, int32(len(nsn))) {
		return false
	}
	return d.re.MatchString(nsn)
}

// valid is getNumberTypeHelper(nsn, metadata) != UNKNOWN.
func (t *regionTest) valid(nsn string) bool {
	if !t.general.matches(nsn) {
		return false
	}
	for _, d := range t.other {
		if d.matches(nsn) {
			return true
		}
	}
	if t.fixed.matches(nsn) {
		return true
	}
	return !t.sameFixedMob && t.mobile.matches(nsn)
}

func descOf(d *phonenumbers.PhoneNumberDesc) desc {
	if d == nil {
		return desc{}
	}
	return desc{lengths: d.PossibleLength, re: regexp.MustCompile("^(?:" + d.GetNationalNumberPattern() + ")$")}
}

var regionTests sync.Map // country code → []regionTest (nil: metadata not found)

// regionTestsOf returns the tests of country code cc's countries, in the
// library's order, compiled on first use; nil when a country's metadata
// is missing.
func regionTestsOf(cc int) []regionTest {
	if v, ok := regionTests.Load(cc); ok {
		return v.([]regionTest)
	}
	tests := buildRegionTests(cc)
	regionTests.Store(cc, tests)
	return tests
}

func buildRegionTests(cc int) []regionTest {
	coll, err := phonenumbers.MetadataCollection()
	if err != nil {
		return nil
	}
	byRegion := map[string]*phonenumbers.PhoneMetadata{}
	for _, m := range coll.GetMetadata() {
		byRegion[m.GetId()] = m
	}
	var tests []regionTest
	for _, r := range phonenumbers.GetRegionCodesForCountryCode(cc) {
		m := byRegion[r]
		if m == nil || int(m.GetCountryCode()) != cc {
			return nil
		}
		t := regionTest{region: r}
		if ld := m.GetLeadingDigits(); len(ld) > 0 {
			t.leading = regexp.MustCompile("^(?:" + ld + ")")
		} else {
			t.general = descOf(m.GetGeneralDesc())
			for _, d := range []*phonenumbers.PhoneNumberDesc{
				m.GetPremiumRate(), m.GetTollFree(), m.GetSharedCost(), m.GetVoip(),
				m.GetPersonalNumber(), m.GetPager(), m.GetUan(), m.GetVoicemail(),
			} {
				t.other = append(t.other, descOf(d))
			}
			t.fixed, t.mobile = descOf(m.GetFixedLine()), descOf(m.GetMobile())
			t.sameFixedMob = m.GetSameMobileAndFixedLinePattern()
		}
		tests = append(tests, t)
	}
	return tests
}

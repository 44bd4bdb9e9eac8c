package phone

import (
	"errors"
	"slices"
	"testing"
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
		if got.E164 != c.e164 || got.Region != c.region || !slices.Equal(got.Zones, c.zones) {
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
		if _, err := lookup("+1212555" + string(rune('0'+i%10)) + "100"); err != nil {
			b.Fatal(err)
		}
	}
}

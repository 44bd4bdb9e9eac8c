package sms

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAlphabetHas128Positions(t *testing.T) {
	// 128 positions of the default table, one of them the escape.
	if n := utf8.RuneCountInString(gsmBasic); n != 128 {
		t.Fatalf("default alphabet has %d positions, want 128", n)
	}
	if n := len(septets); n != 127+10 {
		t.Fatalf("septet table has %d characters, want 137 (127 basic + 10 extension)", n)
	}
}

func TestCount(t *testing.T) {
	a := func(n int) string { return strings.Repeat("a", n) }
	u := func(n int) string { return strings.Repeat("ж", n) } // Cyrillic: UCS-2, 1 unit
	const emoji = "😀"                                         // outside the BMP: 2 units
	cases := []struct {
		name     string
		text     string
		enc      Encoding
		units    int
		segments int
	}{
		{"empty", "", GSM7, 0, 1},
		{"one char", "a", GSM7, 1, 1},
		{"gsm 160", a(160), GSM7, 160, 1},
		{"gsm 161", a(161), GSM7, 161, 2},
		{"gsm 306", a(306), GSM7, 306, 2},
		{"gsm 307", a(307), GSM7, 307, 3},
		{"gsm 459", a(459), GSM7, 459, 3},
		{"gsm 460", a(460), GSM7, 460, 4},
		{"gsm basic specials", "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ¤¡ÄÖÑÜ§¿äöñüà", GSM7, 44, 1},
		// Extension characters are two septets each.
		{"every extension char", "\f^{}\\[~]|€", GSM7, 20, 1},
		{"euro makes 161 septets", a(159) + "€", GSM7, 161, 2},
		{"euro at 160 septets", a(158) + "€", GSM7, 160, 1},
		// 152 + an escape pair does not fit into the first 153: it moves to
		// the second segment, which then holds 2+152 = 154 > 153 septets of
		// text, so a third segment starts.
		{"escape pair not split", a(152) + "[" + a(152), GSM7, 306, 3},
		{"escape pair fits exactly", a(151) + "[" + a(153), GSM7, 306, 2},
		{"306 septets of extension chars", strings.Repeat("|", 153), GSM7, 306, 3},
		// One non-GSM character makes the whole text UCS-2.
		{"ucs2 70", u(70), UCS2, 70, 1},
		{"ucs2 71", u(71), UCS2, 71, 2},
		{"ucs2 134", u(134), UCS2, 134, 2},
		{"ucs2 135", u(135), UCS2, 135, 3},
		{"gsm text with one non-gsm char", a(69) + "ж", UCS2, 70, 1},
		{"gsm text turned ucs2 at 71", a(70) + "ж", UCS2, 71, 2},
		{"backtick is not gsm", "`", UCS2, 1, 1},
		{"extension char in ucs2 is one unit", u(69) + "€", UCS2, 70, 1},
		// Emoji: two code units.
		{"emoji at 70 units", u(68) + emoji, UCS2, 70, 1},
		{"emoji makes 71 units", u(69) + emoji, UCS2, 71, 2},
		{"emoji across a part boundary moves", u(66) + emoji + u(66), UCS2, 134, 3},
		{"emoji fits exactly", u(65) + emoji + u(67), UCS2, 134, 2},
		{"only emoji 35", strings.Repeat(emoji, 35), UCS2, 70, 1},
		{"only emoji 36: 33 per part", strings.Repeat(emoji, 36), UCS2, 72, 2},
		{"only emoji 67: 33+33+1", strings.Repeat(emoji, 67), UCS2, 134, 3},
		{"invalid utf-8 is ucs2", "\xff", UCS2, 1, 1},
		{"nul is not gsm", "\x00", UCS2, 1, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Count(c.text)
			want := Info{Encoding: c.enc, Units: c.units, Segments: c.segments}
			if got != want {
				t.Fatalf("Count = %+v, want %+v", got, want)
			}
			if s := Segments(c.text); s != c.segments {
				t.Fatalf("Segments = %d, want %d", s, c.segments)
			}
		})
	}
}

package sms

import "unicode/utf16"

// Encoding is the character encoding an SMS text is sent in.
type Encoding int

const (
	// GSM7 is the GSM 03.38 7-bit default alphabet with its extension
	// table.
	GSM7 Encoding = iota
	// UCS2 is the 16-bit encoding used when any character is outside
	// GSM-7.
	UCS2
)

func (e Encoding) String() string {
	if e == GSM7 {
		return "GSM-7"
	}
	return "UCS-2"
}

// Segment sizes: the units of one lone segment, and of each segment of a
// concatenated message.
const (
	GSM7Single   = 160
	GSM7Multi    = 153
	UCS2Single   = 70
	UCS2Multi    = 67
	gsmExtension = "\f^{}\\[~]|€"
)

// gsmBasic is the GSM 03.38 default alphabet, in table order. The escape
// (0x1B) is left out: it is not a character a text can hold.
var gsmBasic = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞ\x00ÆæßÉ" +
	" !\"#¤%&'()*+,-./0123456789:;<=>?" +
	"¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§" +
	"¿abcdefghijklmnopqrstuvwxyzäöñüà"

var septets = func() map[rune]int {
	m := make(map[rune]int, 140)
	for _, r := range gsmBasic {
		m[r] = 1
	}
	delete(m, 0) // the placeholder for the escape
	for _, r := range gsmExtension {
		m[r] = 2
	}
	return m
}()

// Info describes how a text is sent.
type Info struct {
	// Encoding is GSM7 or UCS2.
	Encoding Encoding
	// Units is the length of the text in septets (GSM-7) or UTF-16 code
	// units (UCS-2).
	Units int
	// Segments is the number of segments, at least 1.
	Segments int
}

// Count returns the encoding, length and segment count of text, by the
// rules in the package documentation.
func Count(text string) Info {
	enc := Detect(text)
	single, multi := GSM7Single, GSM7Multi
	width := gsmWidth
	if enc == UCS2 {
		single, multi = UCS2Single, UCS2Multi
		width = utf16.RuneLen
	}
	units := 0
	for _, r := range text {
		units += width(r)
	}
	info := Info{Encoding: enc, Units: units, Segments: 1}
	if units <= single {
		return info
	}
	// Concatenated: fill segments greedily, never splitting a character
	// that takes two units.
	used := 0
	for _, r := range text {
		w := width(r)
		if used+w > multi {
			info.Segments++
			used = 0
		}
		used += w
	}
	return info
}

// Segments returns the number of segments text occupies, at least 1. It
// is Count(text).Segments.
func Segments(text string) int {
	return Count(text).Segments
}

// Detect returns GSM7 when every character of text is in the GSM 03.38
// default alphabet or extension table, and UCS2 otherwise.
func Detect(text string) Encoding {
	for _, r := range text {
		if septets[r] == 0 {
			return UCS2
		}
	}
	return GSM7
}

// gsmWidth is the septets of a character already known to be GSM-7.
func gsmWidth(r rune) int { return septets[r] }

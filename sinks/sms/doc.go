// Package sms counts the segments an SMS text occupies, the unit in which
// SMS providers bill and rate-limit.
//
// # Rules
//
// A text is GSM-7 when every character is in the GSM 03.38 default alphabet
// or its extension table, and UCS-2 otherwise: one character outside GSM-7
// makes the whole text UCS-2.
//
//   - GSM-7: a character of the default alphabet is one septet; a character
//     of the extension table (form feed, ^ { } \ [ ~ ] | €) is two, an
//     escape and the character. Up to 160 septets fit in one segment. A
//     longer text is concatenated: 153 septets per segment (the user data
//     header takes the rest), and an escape pair is never split across two
//     segments, so a segment that has one septet left before an extension
//     character ends there.
//   - UCS-2: every character is one UTF-16 code unit, except a character
//     outside the Basic Multilingual Plane (most emoji), which is a
//     surrogate pair of two. Up to 70 code units fit in one segment; a
//     longer text has 67 per segment, and a surrogate pair is never split,
//     so a segment with one unit left before a pair ends there.
//   - An empty text is one segment: the request is still one message, and
//     a cost of zero tokens would not be a cost at all.
//
// Invalid UTF-8 counts as U+FFFD, which is UCS-2. The counts are those of
// a text sent as is: providers that transliterate ("smart encoding") or
// that use national language shift tables may bill fewer segments.
package sms

package backend

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/throttlehq/throttle/internal/phone"
)

// Weekdays is a set of days of the week: bit d is time.Weekday d. The
// zero value means every day.
type Weekdays uint8

// EveryDay holds the seven days.
const EveryDay Weekdays = 1<<7 - 1

// Has reports whether d is in the set; the zero set has every day.
func (w Weekdays) Has(d time.Weekday) bool { return w == 0 || w&(1<<d) != 0 }

var dayNames = [7]string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}

// ParseWeekdays parses a list of days and ranges separated by commas:
// "mon-fri", "mon-sat", "sat,sun", "fri-mon" (a range may wrap past
// Sunday). Days are the first three letters of their English names, in
// any case; "" is every day.
func ParseWeekdays(s string) (Weekdays, error) {
	if strings.TrimSpace(s) == "" {
		return EveryDay, nil
	}
	day := func(s string) (int, bool) {
		i := slices.Index(dayNames[:], strings.ToLower(strings.TrimSpace(s)))
		return i, i >= 0
	}
	var w Weekdays
	for part := range strings.SplitSeq(s, ",") {
		a, b, isRange := strings.Cut(part, "-")
		from, ok1 := day(a)
		to, ok2 := from, true
		if isRange {
			to, ok2 = day(b)
		}
		if !ok1 || !ok2 {
			return 0, &ParamError{Param: "Days", Msg: "must be days (mon, tue, ... sun) or ranges of days (mon-fri), separated by commas", Value: s}
		}
		for d := from; ; d = (d + 1) % 7 {
			w |= 1 << d
			if d == to {
				break
			}
		}
	}
	return w, nil
}

// String writes the set as ParseWeekdays reads it: "mon-sun", "mon-sat".
func (w Weekdays) String() string {
	if w == 0 || w == EveryDay {
		return "mon-sun"
	}
	var parts []string
	for i := 0; i < 7; {
		d := (i + 1) % 7 // from Monday
		if !w.Has(time.Weekday(d)) {
			i++
			continue
		}
		j := i
		for j+1 < 7 && w.Has(time.Weekday((j+2)%7)) {
			j++
		}
		if j == i {
			parts = append(parts, dayNames[d])
		} else {
			parts = append(parts, dayNames[d]+"-"+dayNames[(j+1)%7])
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// Calendar is the daily open time of a send window, in local time: from
// From after midnight until To (exclusive) on each of Days. From after To
// spans midnight (22:00 to 06:00): the window opens on one of Days and
// closes the next morning. To may be 24h (midnight at the end of the day).
type Calendar struct {
	From, To time.Duration
	// Days are the days the window opens. Zero: every day.
	Days Weekdays
}

// ParseClock parses "HH:MM" or "HH:MM:SS" (00:00 to 24:00) as the time
// after midnight.
func ParseClock(s string) (time.Duration, error) {
	bad := &ParamError{Param: "Clock", Msg: "must be HH:MM or HH:MM:SS, 00:00 to 24:00", Value: s}
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, bad
	}
	var v [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || len(p) != 2 || n < 0 || (i > 0 && n > 59) {
			return 0, bad
		}
		v[i] = n
	}
	d := time.Duration(v[0])*time.Hour + time.Duration(v[1])*time.Minute + time.Duration(v[2])*time.Second
	if d > 24*time.Hour {
		return 0, bad
	}
	return d, nil
}

func (c Calendar) validate(param string) error {
	bad := func(field, msg string, v any) error {
		return &ParamError{Param: param + "." + field, Msg: msg, Value: v}
	}
	switch {
	case c.From < 0 || c.From >= 24*time.Hour:
		return bad("From", "must be at least 00:00 and before 24:00", c.From)
	case c.To <= 0 || c.To > 24*time.Hour:
		return bad("To", "must be after 00:00 and at most 24:00", c.To)
	case c.From == c.To:
		return bad("To", "must differ from From (00:00 to 24:00 is always open)", c.To)
	case c.Days&^EveryDay != 0:
		return bad("Days", "has bits past Saturday", int(c.Days))
	}
	return nil
}

// Window makes a layer a send window: it grants only while the local time
// of the message's key (its recipient) is inside the window's Calendar, and
// a message outside it waits (or, with ActionDelay, the default, is set
// aside) until the window opens. A window keeps no state: it only compares
// the store's clock with the open intervals of the key's zone.
type Window struct {
	// Calendar is the window of every key but those of Countries.
	Calendar
	// Location is the time zone of every key. Nil with ByNumber.
	Location *time.Location
	// ByNumber takes each key's zone from its telephone number (E.164,
	// see the e164 template function): the zone of its prefix, so US 212
	// is America/New_York and 415 America/Los_Angeles. A number whose
	// prefix covers several zones (Idaho's 208: Boise and Los Angeles) is
	// open only while the window is open in all of them, or, when they
	// share no open time (a US toll-free number spans Guam to Halifax),
	// in DefaultLocation. A number that is not placed gets
	// DefaultLocation. A key that is not a telephone number
	// refuses the request for good (a *LimitError with ActionDeadLetter).
	ByNumber bool
	// DefaultLocation is the zone of a number ByNumber cannot place.
	// Default UTC.
	DefaultLocation *time.Location
	// Countries override the Calendar for the numbers of some countries,
	// by ISO 3166 code ("FR"); the keys must then be telephone numbers.
	Countries map[string]Calendar
	// Exempt lists the classes the window does not hold back (one-time
	// codes sent as PriorityHigh).
	Exempt []Priority
}

// needsNumber reports whether the window reads its keys as numbers.
func (w *Window) needsNumber() bool { return w.ByNumber || len(w.Countries) > 0 }

func (w *Window) validate(param string) error {
	var errs []error
	errs = append(errs, w.Calendar.validate(param+".Calendar"))
	for c, cal := range w.Countries {
		if len(c) != 2 || strings.ToUpper(c) != c {
			errs = append(errs, &ParamError{Param: param + ".Countries", Msg: "must be keyed by ISO 3166 codes in capitals (FR)", Value: c})
		}
		errs = append(errs, cal.validate(param+".Countries["+c+"]"))
	}
	if w.ByNumber && w.Location != nil {
		errs = append(errs, &ParamError{Param: param + ".Location", Msg: "must be nil with ByNumber", Value: w.Location.String()})
	}
	for _, p := range w.Exempt {
		if p >= NumPriorities {
			errs = append(errs, &ParamError{Param: param + ".Exempt", Msg: "must be high, normal or low", Value: int(p)})
		}
	}
	if w.Location == nil && !w.ByNumber {
		w.Location = time.UTC
	}
	if w.DefaultLocation == nil {
		w.DefaultLocation = time.UTC
	}
	return errors.Join(errs...)
}

// exempt reports whether class p passes the window.
func (w *Window) exempt(p Priority) bool { return slices.Contains(w.Exempt, p) }

// windowSpans is how many open intervals a request carries: enough for the
// store to find the current or next one even when its clock is well off the
// caller's.
const windowSpans = 3

// windowBack is how far before the caller's clock the intervals start: a
// store whose clock is behind by more sees a window that closed as open
// no longer (it waits for the next one).
const windowBack = time.Hour

// WindowSpans returns the open intervals of window layer l for a request
// of class p whose key in l is key, around t (the caller's clock): up to
// three intervals [start, end) in µs, as start, end pairs, the first one
// ending after t-1h, adjacent ones merged. A store decides with them at
// its own clock (WindowWait). It returns nil for an exempt class and for a
// layer that is not a window, and a *LimitError with ActionDeadLetter for
// a key that is not a telephone number when the window needs one.
//
// Results are cached by zone and calendar for a minute of t.
func WindowSpans(l Layer, key string, p Priority, t time.Time) ([]int64, error) {
	w := l.Window
	if w == nil || w.exempt(p) {
		return nil, nil
	}
	cal := w.Calendar
	var zs *zoneSet
	if w.needsNumber() {
		info, err := phone.Lookup(key)
		if err != nil {
			return nil, &LimitError{Layer: l.Name, Action: ActionDeadLetter, Reason: "the key is not a telephone number: " + err.Error(), err: err}
		}
		if c, ok := phone.ByCountry(info, w.Countries); ok {
			cal = c
		}
		if w.ByNumber {
			zs = zonesOf(info.Zones, w.DefaultLocation)
		}
	}
	if zs == nil {
		zs = zonesOf(nil, w.Location)
	}
	return spansFor(cal, zs, w.DefaultLocation, t), nil
}

// zoneSet is a list of zone names loaded: the zones that load, in order,
// or the default zone when none does.
type zoneSet struct {
	names []string         // the list, as given
	def   *time.Location   // the default it was loaded with
	locs  []*time.Location // never empty
	key   string           // the names of locs, joined by spaces
}

// zonesOf returns names loaded, def when there are none or none loads. A
// list is loaded once: the sets are cached by the list's backing array
// (phone.Info.Zones shares one per prefix) and checked against its
// contents, up to zoneSetsMax of them (then the cache starts over).
func zonesOf(names []string, def *time.Location) *zoneSet {
	id := zoneSetID{n: len(names), def: def}
	if len(names) > 0 {
		id.first = &names[0]
	}
	zoneSets.mu.RLock()
	zs, ok := zoneSets.m[id]
	zoneSets.mu.RUnlock()
	if ok && slices.Equal(zs.names, names) {
		return zs
	}
	zs = &zoneSet{names: names, def: def}
	for _, n := range names {
		if loc := loadZone(n); loc != nil {
			zs.locs = append(zs.locs, loc)
		}
	}
	if len(zs.locs) == 0 {
		zs.locs = []*time.Location{def}
	}
	locNames := make([]string, len(zs.locs))
	for i, l := range zs.locs {
		locNames[i] = l.String()
	}
	zs.key = strings.Join(locNames, " ")
	zoneSets.mu.Lock()
	if len(zoneSets.m) >= zoneSetsMax {
		clear(zoneSets.m)
	}
	zoneSets.m[id] = zs
	zoneSets.mu.Unlock()
	return zs
}

// zoneSetsMax bounds the cache of zoneSets.
const zoneSetsMax = 4096

type zoneSetID struct {
	first *string // the list's first element; nil for an empty one
	n     int
	def   *time.Location
}

// loadZone loads the zone named n, cached; nil when it does not load.
func loadZone(n string) *time.Location {
	if v, ok := zoneCache.Load(n); ok {
		return v.(*time.Location)
	}
	loc, err := time.LoadLocation(n)
	if err != nil {
		loc = nil
	}
	zoneCache.Store(n, loc)
	return loc
}

var (
	zoneCache sync.Map // zone name → *time.Location (nil: not loadable)
	zoneSets  = struct {
		mu sync.RWMutex
		m  map[zoneSetID]*zoneSet
	}{m: map[zoneSetID]*zoneSet{}}
	spanCache = struct {
		mu sync.RWMutex
		m  map[spanKey]*spanEntry
	}{m: map[spanKey]*spanEntry{}}
)

// spanKey names the spans of a calendar in a set of zones (by their names)
// with a default zone (by its name).
type spanKey struct {
	cal       Calendar
	locs, def string
}

type spanEntry struct {
	at    int64 // when computed, µs
	spans []int64
}

// spansFor returns the open intervals of cal in every zone of zs (the
// instants open in all of them) around t, cached for a minute of t; those
// of def when the zones share no open time (a prefix spanning the
// Pacific). The spans returned are shared: read them, never write.
func spansFor(cal Calendar, zs *zoneSet, def *time.Location, t time.Time) []int64 {
	k := spanKey{cal, zs.key, def.String()}
	us := t.UnixMicro()
	spanCache.mu.RLock()
	e, ok := spanCache.m[k]
	spanCache.mu.RUnlock()
	if ok && us >= e.at && us < e.at+int64(time.Minute/time.Microsecond) {
		return e.spans
	}
	var spans []int64
	for i, loc := range zs.locs {
		s := calendarSpans(cal, loc, t)
		if i == 0 {
			spans = s
		} else {
			spans = intersect(spans, s)
		}
	}
	if len(spans) == 0 && len(zs.locs) > 1 { // no time open in all: the default zone
		spans = calendarSpans(cal, def, t)
	}
	if len(spans) > 2*windowSpans {
		spans = spans[:2*windowSpans]
	}
	spanCache.mu.Lock()
	spanCache.m[k] = &spanEntry{at: us, spans: spans}
	spanCache.mu.Unlock()
	return spans
}

// calendarSpans returns cal's open intervals in loc ending after
// t-windowBack, over the next eight days, adjacent ones merged, as µs
// pairs.
func calendarSpans(cal Calendar, loc *time.Location, t time.Time) []int64 {
	from := t.Add(-windowBack).UnixMicro()
	lt := t.In(loc)
	y, m, d := lt.Date()
	var out []int64
	for i := -1; i <= 8; i++ {
		day := time.Date(y, m, d+i, 12, 0, 0, 0, loc) // noon: never in a DST gap
		if !cal.Days.Has(day.Weekday()) {
			continue
		}
		s := wall(day, cal.From, loc)
		endDay := day
		if cal.From > cal.To {
			endDay = time.Date(y, m, d+i+1, 12, 0, 0, 0, loc)
		}
		e := wall(endDay, cal.To, loc)
		su, eu := s.UnixMicro(), e.UnixMicro()
		if eu <= from || eu <= su {
			continue
		}
		if n := len(out); n > 0 && su <= out[n-1] {
			out[n-1] = max(out[n-1], eu)
			continue
		}
		out = append(out, su, eu)
	}
	return out
}

// wall returns the instant the clocks of loc show clock after midnight on
// day's date. In a spring-forward gap it is the instant after the gap.
func wall(day time.Time, clock time.Duration, loc *time.Location) time.Time {
	y, m, d := day.Date()
	h, mi, sec := int(clock/time.Hour), int(clock%time.Hour/time.Minute), int(clock%time.Minute/time.Second)
	t := time.Date(y, m, d, h, mi, sec, 0, loc)
	if t.Hour() != h%24 || t.Minute() != mi {
		// A clock time that does not exist that day (it fell in a
		// spring-forward gap): the window opens when the clocks jump.
		if start, _ := t.ZoneBounds(); !start.IsZero() && t.Sub(start) < 3*time.Hour {
			return start
		}
	}
	return t
}

// intersect returns the instants in both a and b (µs pairs, sorted).
func intersect(a, b []int64) []int64 {
	var out []int64
	for i, j := 0, 0; i < len(a) && j < len(b); {
		s, e := max(a[i], b[j]), min(a[i+1], b[j+1])
		if s < e {
			out = append(out, s, e)
		}
		if a[i+1] < b[j+1] {
			i += 2
		} else {
			j += 2
		}
	}
	return out
}

// WindowWait returns, for open intervals spans (WindowSpans) and a request
// that goes out at send, how long after now the window is open at send or
// after it: 0 when send is inside an interval, else the next start less
// now. ok is false when send is past every interval: a store clock ahead of
// the caller's by days. nil spans (an exempt class) are always open.
func WindowWait(spans []int64, send, now int64) (wait int64, ok bool) {
	if spans == nil {
		return 0, true
	}
	for i := 0; i+1 < len(spans); i += 2 {
		if send < spans[i] {
			return spans[i] - now, true
		}
		if send < spans[i+1] {
			return 0, true
		}
	}
	return 0, false
}

// FormatSpans writes spans as the layer scripts read them: the integers
// separated by spaces, "" for none (always open).
func FormatSpans(spans []int64) string {
	if spans == nil {
		return ""
	}
	if len(spans) == 0 {
		return "0 0" // never open: an empty interval, past which nothing waits
	}
	b := make([]byte, 0, 17*len(spans))
	for i, s := range spans {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, s, 10)
	}
	return string(b)
}

// Amount is an amount of money in millionths of its currency's unit
// (micro-units): integer, so that budgets add up exactly, to well below a
// cent. 1.00 is 1_000_000.
type Amount int64

// MaxAmount is the largest Amount a budget or price may be: 2^53 micro
// units, which Lua numbers hold exactly (9 billion units).
const MaxAmount Amount = 1 << 53

// ParseAmount parses a decimal amount such as "500.00" or "0.0079" exactly
// (no floating point): at most six decimals, not negative.
func ParseAmount(s string) (Amount, error) {
	bad := &ParamError{Param: "Amount", Msg: "must be a decimal number >= 0 with at most 6 decimals", Value: s}
	s = strings.TrimSpace(s)
	ip, fp, _ := strings.Cut(s, ".")
	if ip == "" && fp == "" || len(fp) > 6 || strings.HasPrefix(ip, "-") || strings.HasPrefix(ip, "+") {
		return 0, bad
	}
	if ip == "" {
		ip = "0"
	}
	n, err := strconv.ParseInt(ip, 10, 64)
	if err != nil || n > int64(MaxAmount)/1e6 {
		return 0, bad
	}
	f := int64(0)
	if fp != "" {
		if f, err = strconv.ParseInt(fp+strings.Repeat("0", 6-len(fp)), 10, 64); err != nil || f < 0 {
			return 0, bad
		}
	}
	a := Amount(n*1e6 + f)
	if a > MaxAmount {
		return 0, bad
	}
	return a, nil
}

// AmountOf converts a float amount (a YAML number) to micro-units, rounded
// to the nearest: exact for any amount written with at most six decimals.
func AmountOf(f float64) (Amount, error) {
	if math.IsNaN(f) || f < 0 || f*1e6 > float64(MaxAmount) {
		return 0, &ParamError{Param: "Amount", Msg: "must be >= 0 and at most 9e9", Value: f}
	}
	return ParseAmount(strconv.FormatFloat(math.Round(f*1e6)/1e6, 'f', 6, 64))
}

// String writes the amount with two decimals, more when it has them:
// "500.00", "0.0079".
func (a Amount) String() string {
	s := fmt.Sprintf("%d.%06d", int64(a)/1e6, int64(a)%1e6)
	for strings.HasSuffix(s, "0") && len(s)-strings.IndexByte(s, '.') > 3 {
		s = s[:len(s)-1]
	}
	return s
}

// Float returns the amount in units, for metrics.
func (a Amount) Float() float64 { return float64(a) / 1e6 }

// IsBudget reports whether the layer is a spend budget.
func (l Layer) IsBudget() bool { return l.Budget > 0 }

// IsWindow reports whether the layer is a send window.
func (l Layer) IsWindow() bool { return l.Window != nil }

// counted reports whether the layer counts usage per calendar window: a
// quota or a budget.
func (l Layer) counted() bool { return l.IsQuota() || l.IsBudget() }

// charge returns what request req costs on counted layer l: its Cost on
// a quota, its Price on a budget.
func (l Layer) charge(req LayerRequest) int64 {
	if l.IsBudget() {
		return int64(req.Price)
	}
	return int64(req.Cost)
}

// limit returns the allowance of counted layer l per window.
func (l Layer) limit() int64 {
	if l.IsBudget() {
		return int64(l.Budget)
	}
	return int64(l.Quota)
}

// setUsed records a counted layer's usage in st: Used for a quota, Spent
// for a budget.
func (st *LayerState) setUsed(l Layer, used int64) {
	if l.IsBudget() {
		st.Spent = Amount(used)
		return
	}
	st.Used = int(used)
}

// WindowState returns the interval of spans that holds now, or the next
// one, and whether now is inside it.
func WindowState(spans []int64, now int64) ([2]time.Time, bool) {
	if spans == nil {
		return [2]time.Time{}, true
	}
	for i := 0; i+1 < len(spans); i += 2 {
		if now < spans[i+1] {
			return [2]time.Time{time.UnixMicro(spans[i]), time.UnixMicro(spans[i+1])}, now >= spans[i]
		}
	}
	return [2]time.Time{}, false
}

// SetsAside reports whether the layer refuses with ActionDelay, given or
// by default (a window's), so that a consumer must be able to set messages
// aside.
func (l Layer) SetsAside() bool {
	return l.OnExceed == ActionDelay || (l.OnExceed == "" && l.Window != nil)
}

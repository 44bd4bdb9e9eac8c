// Package msgtmpl is the one place that defines what a template over a
// message sees and may call: the HTTP sink's body and URL templates, the cost
// template, the ordering key and the layer key templates all use it, so a
// template that works in one works in the others. The rules as a
// configuration user sees them: docs/configuration.md (Message templates) in
// the repository.
//
// # Data and functions
//
// A template sees a [Data] built from the message: .JSON (the body parsed as
// JSON), .Body, .Key, .Headers, .Source and .Attempt. Besides the
// text/template builtins (urlquery, print, index, ...) it may call the
// functions of [FuncMap]: json, which encodes its argument as JSON; form,
// which encodes a map, or alternating keys and values, as
// application/x-www-form-urlencoded; sms_segments, the SMS segments a text
// occupies (package sinks/sms); and sms_encoding, "GSM-7" or "UCS-2".
//
// [CostFunc] turns a template into a consumer.CostFunc ({{sms_segments
// .JSON.text}}), and [KeysFunc] turns the key templates of a bucket's keyed
// layers into consumer.LimitOptions.Keys. [Compile] makes a [Template] that
// renders message after message, as the HTTP sink's body and URL do. All
// three read a template of simple fields ({{.JSON.to}}, {{form "To"
// .JSON.to "Body" .JSON.text}}, ...) straight from the raw message, and
// run any other as Render does, with the same output and errors.
//
// # Failures and bounds
//
// Templates parsed with [Parse] and run by [Render] fail, rather than
// print "<no value>", when they refer to a missing JSON field or header
// (use index for optional headers, with or if for optional fields) or
// print a JSON null ([ErrNoValue]), and when they read .JSON of a body that
// is not JSON ([ErrNotJSON]). An execution is bounded in steps, nesting,
// output and time ([MaxSteps], [MaxDepth], [MaxOutputBase], [MaxTime]):
// past a bound it fails ([ErrLimit]). The cost and key functions make such
// a failure a consumer.Permanent error, so that the message is
// dead-lettered with the reason.
//
// # The fast path
//
// [KeysFunc], [CostFunc] and [DedupeKeyFunc] run for every message, and
// their templates are mostly one field: {{.JSON.to}}, {{e164 .JSON.to}},
// {{index .Headers "x-tenant"}}, {{sms_segments .JSON.text}}. Such a
// template (text and actions that read .JSON.a.b, .Key, .Body or a
// header, through e164, sms_segments, sms_encoding or slice with constant
// indexes) is evaluated from the raw message, the body checked with
// json.Valid and only the field decoded, rendering exactly what Render
// renders; wherever the template could fail, the template runs instead,
// so the errors are Render's. Render itself always executes the template.
//
// # Concurrency
//
// Everything in this package is safe for concurrent use: a parsed template
// may be executed from many goroutines at once.
package msgtmpl

// throttle console: renders the frames of /api/events (or /api/frame,
// polled) and sends the actions. Every value is written with textContent:
// nothing from the server is parsed as HTML. The token lives in this
// page's memory only: no cookie, no storage.
"use strict";

const $ = (sel, root) => (root || document).querySelector(sel);
let readOnly = true;
let lastFrame = null;

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

function fmtRate(x) {
  if (x === null || x === undefined || Number.isNaN(x)) return "?";
  if (x >= 100) return x.toFixed(0) + "/s";
  if (x >= 1 || x === 0) return x.toFixed(1) + "/s";
  const perMin = x * 60;
  if (perMin >= 1) return perMin.toFixed(1) + "/min";
  return (x * 3600).toFixed(1) + "/h";
}

function fmtNum(x, digits) {
  if (x === null || x === undefined) return "?";
  return Number(x).toFixed(digits === undefined ? 1 : digits);
}

function fmtSecs(s) {
  if (s === null || s === undefined) return "?";
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  return (s / 3600).toFixed(1) + " h";
}

// bucketCard returns the card of bucket name, creating it the first time,
// so that what the operator typed in its fields survives the updates.
function bucketCard(name) {
  let card = document.querySelector(`section.bucket[data-bucket="${CSS.escape(name)}"]`);
  if (card) return card;
  const stat = (k, label) => el("div", { class: "stat" }, el("div", { class: "k" }, label), el("div", { class: "v " + k }));
  const rateIn = el("input", { class: "rate-input", placeholder: "10/s", "aria-label": "rate" });
  const forIn = el("input", { class: "pause-input", value: "30s", "aria-label": "pause for" });
  const btn = (cls, label, fn) => { const b = el("button", { class: cls, type: "button" }, label); b.addEventListener("click", fn); return b; };
  card = el("section", { class: "bucket", "data-bucket": name },
    el("h2", {}, el("span", { class: "name" }), el("span", { class: "badge mode" })),
    el("div", { class: "stats" },
      stat("rate", "rate"), stat("delivered", "delivered (live)"), stat("tokens", "tokens"),
      stat("override", "override"), stat("configured", "configured"), stat("paused", "paused"),
      stat("adaptive", "adaptive rate"), stat("warmup", "warm-up"), stat("backlog", "backlog")),
    el("canvas", { class: "chart", width: "900", height: "120" }),
    el("div", { class: "chart-legend" }, el("span", { class: "chart-from" }), el("span", { class: "chart-max" }), el("span", {}, "now")),
    el("div", { class: "actions" },
      rateIn, btn("set-rate", "Set rate", () => act(name, "POST", "rate", { rate: rateIn.value.trim() })),
      btn("clear-rate", "Clear override", () => act(name, "DELETE", "rate")),
      el("span", { class: "sep" }),
      btn("fill", "Fill", () => act(name, "POST", "fill")),
      el("span", { class: "sep" }),
      forIn, btn("pause danger", "Pause", () => act(name, "POST", "pause", { for: forIn.value.trim() })),
      btn("resume", "Resume", () => act(name, "POST", "resume"))),
    el("div", { class: "result", role: "status" }),
    el("ul", { class: "warnings" }),
    el("div", { class: "grid2" },
      el("div", {}, el("h3", {}, "replicas"), el("table", { class: "replicas" })),
      el("div", {}, el("h3", {}, "priority classes"), el("table", { class: "classes" }),
        el("h3", {}, "layers"), el("table", { class: "layers" }), el("div", { class: "layers-note muted" }),
        el("h3", {}, "tenants (fair shares)"), el("table", { class: "tenants" }))));
  $("#buckets").append(card);
  return card;
}

function setText(card, sel, text) { const e = $(sel, card); if (e.textContent !== text) e.textContent = text; }

function table(t, head, rows, empty) {
  t.replaceChildren(el("tr", {}, ...head.map(h => el("th", {}, h))));
  if (rows.length === 0) { t.append(el("tr", {}, el("td", { class: "empty", colspan: String(head.length) }, empty))); return; }
  for (const r of rows) t.append(el("tr", {}, ...r.map(c => el("td", {}, c))));
}

function renderBucket(b, f) {
  const card = bucketCard(b.name);
  const st = b.status || {};
  setText(card, ".name", b.name);
  const mode = $(".mode", card);
  let modeText = b.mode || "no replica";
  let modeClass = b.mode === "shared" ? "ok" : (b.mode ? "warn" : "");
  if (st.paused_seconds > 0) { modeText = "paused"; modeClass = "bad"; }
  if (b.mode && b.mode.startsWith("closed")) modeClass = "bad";
  mode.textContent = modeText; mode.className = "badge mode " + modeClass;

  const ov = st.override;
  let rate = st.rate === null || st.rate === undefined ? "each replica's" : fmtRate(st.rate);
  if (st.paused_seconds > 0 && ov) rate += " (paused)";
  else if (ov && !ov.ignored) rate += " (override)";
  else if (st.configured) rate += " (configured)";
  setText(card, ".rate", rate);
  setText(card, ".delivered", b.delivered === null || b.delivered === undefined ? "?" : fmtRate(b.delivered));
  $(".delivered", card).title = b.delivered_note || "";
  setText(card, ".tokens", st.tokens === null || st.tokens === undefined ? "?" : `${fmtNum(st.tokens)} of ${st.burst}`);
  let ovText = "none";
  if (ov && ov.ignored) ovText = "ignored (out of range)";
  else if (ov) ovText = fmtRate(ov.rate) + (ov.burst ? `, burst ${ov.burst}` : "") + (ov.expires_in_seconds ? `, ${fmtSecs(ov.expires_in_seconds)} left` : ", until cleared");
  setText(card, ".override", ovText);
  setText(card, ".configured", st.configured ? `${fmtRate(st.configured.rate)}, burst ${st.configured.burst}${st.configured.shadow ? ", SHADOW (not enforced)" : ""}` : "unknown");
  let paused = "no";
  if (st.paused_seconds > 0) paused = `${fmtSecs(st.paused_seconds)} more` + (st.paused_by === "operator" ? " (operator)" : st.paused_by ? ` (push-back by ${st.paused_by})` : " (push-back)");
  setText(card, ".paused", paused);
  const ad = st.adaptive;
  setText(card, ".adaptive", ad ? `${fmtRate(ad.rate)} of ${fmtRate(ad.ceiling)}` : "at its ceiling or off");
  const wu = st.warmup;
  setText(card, ".warmup", !wu ? "none" : wu.ramping ? `ramping: ${Math.round(100 * wu.rate_factor)}%, ${fmtSecs(wu.seconds_left)} left` : "cold: the next message starts the ramp");

  const bl = b.backlog;
  setText(card, ".backlog", bl ? `${bl.ready + bl.set_aside} (${bl.ready} ready, ${bl.set_aside} set aside)` : "not reported");
  $(".backlog", card).title = "the source's backlog, as the replicas read it every 5 s and report it in their heartbeats";

  const warnings = $(".warnings", card);
  warnings.replaceChildren(...(st.warnings || []).map(w => el("li", {}, w)));

  const disabled = readOnly;
  for (const b2 of card.querySelectorAll(".actions button, .actions input")) b2.disabled = disabled;

  table($(".replicas", card), ["id", "mode", "delivered", "share", "waiting", "last beat", "configured"],
    (b.replicas || []).map(r => [r.id, (r.mode || "?") + (r.idle ? ", idle" : ""), fmtRate(r.delivered),
      r.share === null || r.share === undefined ? "?" : Math.round(100 * r.share) + "%",
      r.waiting === null || r.waiting === undefined ? "?" : String(r.waiting),
      r.last_beat_seconds === null || r.last_beat_seconds === undefined ? "?" : fmtSecs(r.last_beat_seconds) + " ago",
      r.configured || "not reported"]),
    "no live replica");
  table($(".classes", card), ["class", "reserved", "waiting"],
    (st.classes || []).map(c => [c.priority, c.reserved === null ? "?" : fmtNum(c.reserved), String(c.waiting)]), "unknown");
  // The keys a layer refused most over the last minute, summed over the
  // replicas' heartbeats: shown as they are (an operator's keys, such as
  // recipients; docs/console.md says why they are not masked).
  const topRefused = name => ((st.top_refused || {})[name] || []).slice(0, 5).map(k => `${k.key} (${k.refused})`).join(", ");
  table($(".layers", card), ["layer", "limit", "in Redis", "refused", "last minute", "top keys refused, last minute"],
    (b.layers || []).map(l => [l.name, l.limit, l.in_redis, l.refused === null ? "?" : String(l.refused), l.per_minute === null ? "?" : "+" + l.per_minute, topRefused(l.name)]),
    "none");
  const tn = st.tenants;
  const tenantRows = [];
  if (tn) {
    const waiting = new Map((tn.by_waiting || []).map(w => [w.tenant, w.waiting]));
    for (const s of (tn.by_share || []).slice(0, 5)) {
      tenantRows.push([s.tenant, Math.round(100 * s.share) + "%", waiting.has(s.tenant) ? String(waiting.get(s.tenant)) : "–"]);
      waiting.delete(s.tenant);
    }
    for (const [tenant, n] of [...waiting].slice(0, 5)) tenantRows.push([tenant, "–", String(n)]);
  }
  table($(".tenants", card), ["tenant", "share of the last minute's tokens", "waiting now"], tenantRows, "none reported (no limit.fair, or no tenant in the last minute)");
  setText(card, ".layers-note", b.layers_note || "");
  drawChart(card, b, st, f);
}

function drawChart(card, b, st, f) {
  const c = $("canvas.chart", card);
  const ctx = c.getContext("2d");
  const w = c.width, h = c.height, pad = 6;
  ctx.clearRect(0, 0, w, h);
  const hist = b.history || [];
  let max = 0;
  for (const x of hist) if (x !== null && x > max) max = x;
  const ref = st.rate || (st.configured && st.configured.rate) || 0;
  if (ref > max) max = ref;
  max = max > 0 ? max * 1.15 : 1;
  const y = v => h - pad - (v / max) * (h - 2 * pad);
  const step = hist.length > 1 ? (w - 2 * pad) / (hist.length - 1) : 0;
  if (ref > 0) {
    ctx.strokeStyle = "#9aa3ad"; ctx.setLineDash([4, 4]); ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(pad, y(ref)); ctx.lineTo(w - pad, y(ref)); ctx.stroke(); ctx.setLineDash([]);
  }
  ctx.strokeStyle = "#0969da"; ctx.lineWidth = 2; ctx.beginPath();
  let pen = false;
  hist.forEach((v, i) => {
    if (v === null) { pen = false; return; }
    const px = pad + i * step, py = y(v);
    if (pen) ctx.lineTo(px, py); else ctx.moveTo(px, py);
    pen = true;
  });
  ctx.stroke();
  setText(card, ".chart-from", `delivered, last ${Math.round(f.history_seconds / 60)} min`);
  setText(card, ".chart-max", `top ${fmtRate(max)}` + (ref > 0 ? `; dashed: the rate ${fmtRate(ref)}` : ""));
}

function render(f) {
  lastFrame = f;
  readOnly = f.read_only;
  const access = $("#access");
  if (readOnly) {
    access.textContent = "read-only: console.token is not set, actions are off";
    access.className = "badge warn";
    $("#token-label").hidden = true;
  } else {
    access.textContent = "actions need the console token";
    access.className = "badge";
    $("#token-label").hidden = false;
  }
  const err = $("#error");
  if (f.error) { err.hidden = false; err.textContent = "Reading Redis failed: " + f.error + " (retrying; figures are from the last good read)"; }
  else err.hidden = true;
  $("#updated").textContent = "updated " + new Date(f.at).toLocaleTimeString();
  for (const b of f.buckets || []) renderBucket(b, f);
}

async function act(name, method, what, body) {
  const card = bucketCard(name);
  const out = $(".result", card);
  const headers = {};
  const token = $("#token").value;
  if (token) headers["Authorization"] = "Bearer " + token;
  if (body) headers["Content-Type"] = "application/json";
  out.className = "result"; out.textContent = "…";
  try {
    const resp = await fetch(`api/buckets/${encodeURIComponent(name)}/${what}`, { method, headers, body: body ? JSON.stringify(body) : undefined, credentials: "omit" });
    const data = await resp.json().catch(() => ({}));
    if (resp.ok) { out.className = "result ok"; out.textContent = data.message || "done"; }
    else { out.className = "result err"; out.textContent = `${resp.status}: ${data.error || resp.statusText}`; }
  } catch (e) {
    out.className = "result err"; out.textContent = "the console did not answer: " + e;
  }
}

// Frames come over Server-Sent Events; if the stream fails, poll instead.
let polling = false;
function poll() {
  if (polling) return;
  polling = true;
  const tick = async () => {
    try {
      const resp = await fetch("api/frame", { credentials: "omit" });
      if (resp.ok) render(await resp.json());
    } catch (e) { $("#updated").textContent = "the console does not answer; retrying"; }
    setTimeout(tick, 1000 * ((lastFrame && lastFrame.interval_seconds) || 1));
  };
  tick();
}

if (window.EventSource) {
  const es = new EventSource("api/events");
  es.addEventListener("frame", ev => render(JSON.parse(ev.data)));
  let failures = 0;
  es.onerror = () => { if (++failures >= 3) { es.close(); poll(); } };
  es.onopen = () => { failures = 0; };
} else {
  poll();
}

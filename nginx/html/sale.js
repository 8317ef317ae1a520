// flashgate sale page: polls GET /v1/sales/{id} (public, micro-cached by nginx) and, with a
// token, buys through POST /v1/sales/{id}/orders. No external assets, no framework.
"use strict";

const $ = (id) => document.getElementById(id);
const POLL_MS = 2000;
let saleID = new URLSearchParams(location.search).get("sale") || "";
let timer = 0;
let idemKey = ""; // one Idempotency-Key per purchase attempt, reused when it is retried

function show(el, on) { el.hidden = !on; }

function fmtWhen(s) {
  const now = Date.now(), start = Date.parse(s.starts_at), end = Date.parse(s.ends_at);
  const left = (ms) => {
    const t = Math.max(0, Math.round(ms / 1000));
    const h = Math.floor(t / 3600), m = Math.floor((t % 3600) / 60), sec = t % 60;
    return (h ? h + "h " : "") + (h || m ? m + "m " : "") + sec + "s";
  };
  if (now < start) return "starts in " + left(start - now);
  if (now < end && s.state !== "ended") return "ends in " + left(end - now);
  return "ended " + new Date(end).toLocaleString();
}

async function refresh() {
  clearTimeout(timer);
  if (!saleID) return;
  let wait = POLL_MS;
  try {
    const res = await fetch("/v1/sales/" + encodeURIComponent(saleID), { cache: "no-store" });
    const body = await res.json();
    if (!res.ok) {
      // docs/design.md §3: every error is {"code","message"}; Retry-After says when to ask again.
      const ra = Number(res.headers.get("Retry-After"));
      if (ra > 0) wait = ra * 1000;
      throw new Error(body.message || body.code || res.statusText);
    }
    $("title").textContent = body.title || body.id;
    $("state").textContent = body.state.replace("_", " ");
    $("state").className = "badge " + body.state;
    $("when").textContent = fmtWhen(body);
    $("remaining").textContent = body.remaining;
    $("price").textContent = (body.price_cents / 100).toFixed(2);
    $("limit").textContent = body.per_user_limit;
    $("buybtn").disabled = body.state !== "active";
    show($("info"), true);
    show($("buybox"), true);
    show($("error"), false);
  } catch (e) {
    $("error").textContent = "Sale " + saleID + ": " + e.message;
    show($("error"), true);
  }
  timer = setTimeout(refresh, wait);
}

async function buy(ev) {
  ev.preventDefault();
  const btn = $("buybtn");
  btn.disabled = true;
  if (!idemKey) idemKey = crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random().toString(36).slice(2);
  try {
    const res = await fetch("/v1/sales/" + encodeURIComponent(saleID) + "/orders", {
      method: "POST",
      headers: {
        "Content-Type": "application/json",
        "Authorization": "Bearer " + $("token").value.trim().replace(/^Bearer\s+/i, ""),
        "Idempotency-Key": idemKey,
      },
      body: JSON.stringify({ quantity: Number($("qty").value) }),
    });
    const body = await res.json();
    $("result").textContent = res.status + " " + JSON.stringify(body, null, 2);
    // A definite answer ends the attempt; a 429/5xx may be retried with the same key.
    if (res.status < 429) idemKey = "";
  } catch (e) {
    $("result").textContent = "network error: " + e.message + " (retrying is safe: same Idempotency-Key)";
  } finally {
    btn.disabled = false;
    refresh();
  }
}

$("sale").value = saleID;
$("pick").addEventListener("submit", (ev) => {
  ev.preventDefault();
  saleID = $("sale").value.trim();
  history.replaceState(null, "", "?sale=" + encodeURIComponent(saleID));
  refresh();
});
$("buy").addEventListener("submit", buy);
refresh();

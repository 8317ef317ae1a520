// The live view's script: polls live.json every second and redraws the
// numbers the server rendered (a new sale reloads the page).
"use strict";
(function () {
  const fmt = (x) => (Math.round(x * 10) / 10).toFixed(1);
  const sum = (m) => Object.values(m || {}).reduce((a, b) => a + b, 0);
  function cell(text) { const td = document.createElement("td"); td.textContent = text; return td; }
  function draw(v) {
    document.getElementById("at").textContent = v.at.substring(11, 19);
    document.getElementById("nsales").textContent = v.sales.length;
    document.getElementById("limits").textContent = JSON.stringify(v.gateway_limits, null, 2);
    for (const s of v.sales) {
      const el = document.querySelector('.sale[data-sale="' + s.sale.id + '"]');
      if (!el) { location.reload(); return; }
      const set = (f, t) => { const n = el.querySelector('[data-f="' + f + '"]'); if (n) n.textContent = t; };
      const f = s.funnel, b = s.books;
      set("state", s.state);
      el.querySelector('[data-f="state"]').className = "state " + s.state;
      set("requests_per_sec", fmt(f.requests_per_sec));
      set("refusals_per_sec", fmt(sum(f.refusals_per_sec)));
      set("admissions_per_sec", fmt(f.admissions_per_sec));
      set("pending", b.pending);
      set("sold", b.sold);
      set("remaining", b.remaining);
      set("reserved", b.reserved);
      set("conservation", b.conservation_error_units);
      el.querySelector('[data-f="conservation"]').classList.toggle("bad", b.conservation_error_units !== 0);
      const body = el.querySelector('[data-f="codes"]');
      body.replaceChildren();
      for (const c of Object.keys(f.by_code).sort()) {
        const tr = document.createElement("tr");
        tr.append(cell(c), cell(fmt((f.refusals_per_sec || {})[c] || 0)), cell(f.by_code[c]));
        body.append(tr);
      }
    }
  }
  async function poll() {
    try {
      const r = await fetch("live.json", { credentials: "same-origin", cache: "no-store" });
      if (r.ok) draw(await r.json());
    } catch (e) { /* the next poll tries again */ }
    setTimeout(poll, 1000);
  }
  setTimeout(poll, 1000);
})();

// The live view's script: draws every recent sale from the view the page
// carries, then polls live.json every second and draws it again: the numbers
// of now, the last minutes as charts (uPlot, vendor/uplot), the limits in
// force as tables, and the sale-day actions the credential may take.
"use strict";
(function () {
  // The sale-day actions, each a POST to sales/{sale}/{action} under /ui/
  // (the admin API's handler, with the session's cookie and its CSRF token
  // from the view). Those that stop buyers ask first.
  const ACTIONS = [
    { name: "pause", confirm: "Pause sale %s? Purchases answer 503 paused until it is resumed.", danger: true },
    { name: "resume" },
    { name: "reconcile" },
    { name: "close", confirm: "Close sale %s now? It ends for every buyer.", danger: true },
  ];

  // actionsFor is what the live JSON's role may do: an operator all of them,
  // a viewer (or a role this page does not know, or none) none.
  function actionsFor(role) {
    if (role === "operator") return ACTIONS.map((a) => a.name);
    return [];
  }

  // csrf is the session's CSRF token, from the latest view drawn.
  let csrf = "";

  const COLOR = { requests: "#5b6b82", admissions: "#1a9850", sold: "#1a9850", remaining: "#3b6fd8", p99: "#8e44ad", backlog: "#e67e22" };
  const CODE_COLOR = { limit_reached: "#fd8d3c", sold_out: "#d7301f", rate_limited: "#984ea3", unavailable: "#7f0000", ended: "#7f7f7f" };
  const SPARE = ["#e7298a", "#a6761d", "#17becf", "#66a61e", "#1f78b4", "#b15928"];
  const codeColor = (c, i) => CODE_COLOR[c] || SPARE[i % SPARE.length];

  const fmt1 = (x) => (Math.round(x * 10) / 10).toFixed(1);
  const fmtV = (x) => (x == null ? "–" : Math.abs(x) >= 100 ? String(Math.round(x)) : String(Math.round(x * 100) / 100));
  const sum = (m) => Object.values(m || {}).reduce((a, b) => a + b, 0);
  const utc = (s) => (s ? s.replace("T", " ").replace(/\.\d+/, "").replace("Z", " UTC") : "");
  const hms = (secs) => new Date(secs * 1e3).toISOString().substring(11, 19); // UTC, as the page
  const units = (n) => n + (n === 1 ? " unit" : " units");
  // lastOf is series i's newest value that is not null.
  function lastOf(u, i) {
    const ys = u.data[i];
    for (let k = ys.length - 1; k >= 0; k--) if (ys[k] != null) return ys[k];
    return null;
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function row(cells, numeric) {
    const tr = el("tr");
    cells.forEach((c, i) => tr.append(el("td", numeric && numeric[i] ? "n" : "", String(c))));
    return tr;
  }

  // A chart: one uPlot in box, made again when its series change.
  function Chart(box) {
    this.box = box;
    this.key = null;
    this.u = null;
  }
  Chart.prototype.width = function () {
    return Math.max(200, this.box.clientWidth - 10);
  };
  Chart.prototype.draw = function (lines, x) {
    if (!x) {
      if (!this.box.querySelector(".empty")) this.box.append(el("div", "empty", "nothing heard yet"));
      return;
    }
    const old = this.box.querySelector(".empty");
    if (old) old.remove();
    const data = [x].concat(lines.map((l) => l.values));
    const key = lines.map((l) => l.label).join("|");
    if (this.u && this.key === key) {
      this.u.setData(data);
      return;
    }
    if (this.u) this.u.destroy();
    this.key = key;
    this.u = new uPlot({
      width: this.width(),
      height: 170,
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } },
      axes: [
        { stroke: "#667", space: 90, grid: { stroke: "#eef0f3" }, ticks: { stroke: "#e3e6ea" }, values: (u, splits) => splits.map(hms) },
        { stroke: "#667", size: 56, grid: { stroke: "#eef0f3" }, ticks: { stroke: "#e3e6ea" } },
      ],
      // The legend shows the point under the cursor, or else the newest.
      series: [{ label: "UTC", value: (u, v, si, idx) => (idx == null ? "now" : hms(v)) }].concat(
        lines.map((l) => ({ label: l.label, stroke: l.color, width: 1.6, points: { show: false },
          value: (u, v, si, idx) => fmtV(idx == null ? lastOf(u, si) : v) }))
      ),
    }, data, this.box);
  };
  Chart.prototype.resize = function () {
    if (this.u) this.u.setSize({ width: this.width(), height: 170 });
  };
  Chart.prototype.destroy = function () {
    if (this.u) this.u.destroy();
  };

  // The charts of a sale's series (live.go's Series: one entry a second from
  // start, null where nothing is known).
  const CHARTS = [
    { name: "traffic", title: "answers per second: requests, admissions, refusals by code", lines(s) {
      const codes = Object.keys(s.refusals_per_sec || {}).sort();
      return [
        { label: "requests", color: COLOR.requests, values: s.requests_per_sec },
        { label: "admissions (202)", color: COLOR.admissions, values: s.admissions_per_sec },
      ].concat(codes.map((c, i) => ({ label: c, color: codeColor(c, i), values: s.refusals_per_sec[c] })));
    } },
    { name: "stock", title: "units: sold (MySQL) and remaining (Redis)", lines(s) {
      return [
        { label: "sold", color: COLOR.sold, values: s.sold },
        { label: "remaining", color: COLOR.remaining, values: s.remaining },
      ];
    } },
    { name: "p99", title: "202 latency at the gateways, p99 (ms)", lines(s) {
      return [{ label: "p99 ms", color: COLOR.p99, values: s.accepted_p99_ms }];
    } },
    { name: "backlog", title: "backlog: the sale's orders waiting in JetStream", lines(s) {
      return [{ label: "orders", color: COLOR.backlog, values: s.backlog }];
    } },
  ];

  const STEPS = [
    ["requests_per_sec", "requests/s"], ["refusals_per_sec", "refusals/s"], ["admissions_per_sec", "admissions/s"],
    ["pending", "backlog (JetStream)"], ["sold", "sold (MySQL)"], ["remaining", "remaining (Redis)"],
    ["reserved", "reserved"], ["conservation", "conservation error"],
  ];

  const cards = new Map(); // sale id → {el, charts, actions}

  function newCard(id) {
    const e = el("div", "sale");
    e.dataset.sale = id;
    const h = el("h2");
    h.append(el("span", "", id), el("span", "muted"), el("span", "state"), el("span", "actions"));
    h.children[1].dataset.f = "title";
    h.children[2].dataset.f = "state";
    const win = el("div", "muted");
    win.dataset.f = "window";
    const funnel = el("div", "funnel");
    for (const [f, k] of STEPS) {
      const st = el("div", "step");
      const v = el("div", "v", "–");
      v.dataset.f = f;
      const kk = el("div", "k", k);
      if (f === "remaining") kk.dataset.f = "remaining_of";
      st.append(v, kk);
      funnel.append(st);
    }
    const grid = el("div", "charts");
    const charts = {};
    for (const c of CHARTS) {
      const box = el("div", "chart");
      box.dataset.chart = c.name;
      box.append(el("div", "title", c.title));
      grid.append(box);
      charts[c.name] = new Chart(box);
    }
    const tables = el("div", "tables");
    const lim = el("div");
    lim.append(el("h3", "", "limits in force"));
    const lt = el("table");
    lt.dataset.f = "limits";
    lt.innerHTML = "<thead><tr><th>limit</th><th>at most</th><th>over</th></tr></thead><tbody></tbody>";
    lim.append(lt);
    const codes = el("div");
    codes.append(el("h3", "", "answers by code, since the gateways started"));
    const ct = el("table");
    ct.innerHTML = "<thead><tr><th>code</th><th>per second</th><th>total</th></tr></thead><tbody data-f=\"codes\"></tbody>";
    codes.append(ct);
    tables.append(lim, codes);
    e.append(h, win, funnel, grid, tables);
    return { el: e, charts, actions: null };
  }

  function renderActions(c, id, role) {
    const names = actionsFor(role);
    const key = names.join(",");
    if (c.actions === key) return;
    c.actions = key;
    const box = c.el.querySelector(".actions");
    box.replaceChildren();
    const out = el("span", "result");
    out.dataset.f = "action_result";
    for (const a of ACTIONS.filter((a) => names.includes(a.name))) {
      const b = el("button", a.danger ? "danger" : "", a.name);
      b.type = "button";
      b.dataset.action = a.name;
      b.addEventListener("click", () => act(id, a, out));
      box.append(b);
    }
    box.append(out);
  }

  async function act(id, a, out) {
    if (a.confirm && !window.confirm(a.confirm.replace("%s", id))) return;
    out.textContent = a.name + "…";
    try {
      const r = await fetch("sales/" + encodeURIComponent(id) + "/" + a.name,
        { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf } });
      let msg = "";
      if (!r.ok) {
        try { const b = await r.json(); msg = b.message || b.code || ""; } catch (e) { /* not JSON */ }
      }
      out.textContent = r.ok ? a.name + ": done" : a.name + ": " + r.status + (msg ? " " + msg : "");
    } catch (e) {
      out.textContent = a.name + ": " + e;
    }
  }

  function limitRows(s) {
    const rows = [["stock", units(s.total), "the sale"], ["per user", units(s.per_user_limit), "the sale"], ["per order", units(s.per_order_max), "one order"]];
    for (const l of s.limits || []) {
      const what = l.of === "orders" ? l.max + (l.max === 1 ? " order" : " orders") : units(l.max);
      rows.push(["per " + l.dimension, what, (l.per && l.per !== "sale" ? "a " + l.per + " (" + (s.time_zone || "UTC") + ")" : "the sale")]);
    }
    for (const r of Object.keys(s.regions || {}).sort()) rows.push(["region " + r, units(s.regions[r]), "the sale"]);
    rows.push(["if Redis is lost", s.degrade === "mysql" ? "decided in MySQL" : "closed (503)", s.degrade === "mysql" && s.degrade_rate ? s.degrade_rate + " at once per gateway" : ""]);
    return rows;
  }

  function renderSale(c, s, role) {
    const e = c.el;
    const set = (f, t) => { const n = e.querySelector('[data-f="' + f + '"]'); if (n) n.textContent = t; };
    const f = s.funnel, b = s.books;
    set("title", s.sale.title || "");
    set("state", s.state);
    e.querySelector('[data-f="state"]').className = "state " + s.state;
    set("window", "window " + utc(s.sale.starts_at) + " – " + utc(s.sale.ends_at) + (s.sale.closed ? " · closed" : ""));
    set("requests_per_sec", fmt1(f.requests_per_sec));
    set("refusals_per_sec", fmt1(sum(f.refusals_per_sec)));
    set("admissions_per_sec", fmt1(f.admissions_per_sec));
    set("pending", b.pending);
    set("sold", b.sold);
    set("remaining", b.remaining);
    set("remaining_of", "remaining (Redis) of " + b.total);
    set("reserved", b.reserved);
    set("conservation", b.conservation_error_units);
    e.querySelector('[data-f="conservation"]').classList.toggle("bad", b.conservation_error_units !== 0);
    const codes = e.querySelector('[data-f="codes"]');
    codes.replaceChildren(...Object.keys(f.by_code).sort().map((k) => row([k, fmt1((f.refusals_per_sec || {})[k] || (k === "accepted" ? f.admissions_per_sec : 0)), f.by_code[k]], [false, true, true])));
    e.querySelector('[data-f="limits"] tbody').replaceChildren(...limitRows(s.sale).map((r) => row(r)));
    renderActions(c, s.sale.id, role);
    const x = s.series ? s.series.requests_per_sec.map((_, i) => s.series.start + i) : null;
    if (window.uPlot) {
      for (const ch of CHARTS) c.charts[ch.name].draw(x ? ch.lines(s.series) : [], x);
    }
  }

  const rate = (r) => (r && r.rate > 0 ? r.rate + "/s, burst " + r.burst : "off");

  function renderGateways(limits) {
    const body = document.querySelector("#gwlimits tbody");
    const ids = Object.keys(limits || {}).sort();
    body.replaceChildren(...ids.map((id) => {
      let v = limits[id];
      if (!v || !v.limits) v = { limits: {} };
      const l = v.limits, k = v.keys || {};
      const tr = row([id, l.mode || "local", rate(l.per_ip), rate(l.per_user), rate(l.per_sale), l.max_inflight > 0 ? l.max_inflight : "no cap",
        v.inflight || 0, (k.ip || 0) + " / " + (k.user || 0) + " / " + (k.sale || 0), utc(v.loaded_at), v.source || "", v.last_reload_error || ""],
      [false, false, false, false, false, true, true, true]);
      tr.dataset.gateway = id;
      return tr;
    }));
    if (!ids.length) body.append(row(["no gateway heard from in the last 5 s", "", "", "", "", "", "", "", "", "", ""]));
  }

  function draw(v) {
    csrf = v.csrf || "";
    document.getElementById("at").textContent = v.at.substring(11, 19);
    document.getElementById("nsales").textContent = v.sales.length;
    renderGateways(v.gateway_limits);
    const box = document.getElementById("sales");
    const seen = new Set();
    for (const s of v.sales) {
      let c = cards.get(s.sale.id);
      if (!c) {
        c = newCard(s.sale.id);
        cards.set(s.sale.id, c);
      }
      seen.add(s.sale.id);
      box.append(c.el); // in the view's order
      renderSale(c, s, v.role);
    }
    for (const [id, c] of cards) {
      if (!seen.has(id)) {
        for (const ch of Object.values(c.charts)) ch.destroy();
        c.el.remove();
        cards.delete(id);
      }
    }
    if (!window.uPlot && !document.getElementById("nochart")) {
      const p = el("p", "bad", "The charting library (vendor/uplot) did not load: numbers only.");
      p.id = "nochart";
      box.before(p);
    }
  }

  // What the charts hold, and draw, for a look from the console (and the tests).
  window.flashgateLive = {
    actionsFor,
    draw,
    charts(id) {
      const c = cards.get(id);
      if (!c) return null;
      const out = {};
      for (const [name, ch] of Object.entries(c.charts)) {
        if (!ch.u) continue;
        const d = ch.u.data;
        out[name] = { series: ch.u.series.slice(1).map((s) => s.label), first: d[0][0], last: d[0][d[0].length - 1],
          points: d.slice(1).map((ys) => ys.filter((y) => y != null).length) };
      }
      return out;
    },
  };

  let resizing = 0;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => { for (const c of cards.values()) for (const ch of Object.values(c.charts)) ch.resize(); }, 100);
  });

  async function poll() {
    try {
      const r = await fetch("live.json", { credentials: "same-origin", cache: "no-store" });
      if (r.ok) draw(await r.json());
    } catch (e) { /* the next poll tries again */ }
    setTimeout(poll, 1000);
  }
  try {
    draw(JSON.parse(document.getElementById("first").textContent));
  } catch (e) { /* the first poll draws */ }
  setTimeout(poll, 1000);
})();

// The run page's reward by domain (apps/runs/domains.py): a heatmap of domain × step and a table of domains with a
// sparkline each, both of one page of domains read from the domains endpoint — searched, filtered by category,
// sorted and paged on the server, the steps averaged into buckets there. However many domains the run has, the page
// holds one page of them and one Plotly chart.
// Live: a step's message over the socket carries no per-domain point, only how many it wrote (run_live.js passes
// that on as "studio:step"); the page then reads the page it shows again, at most once every REFRESH_MS.
(function () {
  "use strict";
  const section = document.getElementById("run-domains");
  const root = document.getElementById("run-live");
  if (!section || !root) return;
  const urls = JSON.parse(document.getElementById("run-urls").textContent);
  const template = JSON.parse(JSON.parse(document.getElementById("run-domain-heatmap").textContent));
  const REFRESH_MS = 5000;
  const SEARCH_DELAY_MS = 250;

  const heatmap = section.querySelector("[data-domain-heatmap]");
  const body = section.querySelector("[data-domain-rows-body]");
  const search = section.querySelector("[data-domain-search]");
  const category = section.querySelector("[data-domain-category]");
  const heatmapRows = section.querySelector("[data-domain-rows]");
  const perPage = section.querySelector("[data-domain-per-page]");
  const pageLabel = section.querySelector("[data-page-label]");
  const evalHeader = section.querySelector("[data-domain-eval]");
  const state = { q: "", category: "", sort: "domain", order: "asc", page: 1, per_page: parseInt(perPage.value, 10) };
  // What the tests read: every response rendered (its query and when), the last body.
  const view = window.studioDomains = { state, refreshMs: REFRESH_MS, rendered: [], last: null };

  let controller = null, lastFetchAt = 0, timer = null, stale = false, drawn = false;

  function query() {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(state)) if (value !== "" && value !== null) params.set(key, value);
    return params.toString();
  }

  function load() {
    if (controller) controller.abort();
    controller = new AbortController();
    const asked = query();
    lastFetchAt = Date.now();
    stale = false;
    section.setAttribute("aria-busy", "true");
    return fetch(urls.domains + "?" + asked, { credentials: "same-origin", signal: controller.signal })
      .then(r => { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(data => {
        controller = null;
        section.removeAttribute("aria-busy");
        render(data);
        view.last = data;
        view.rendered.push({ query: asked, at: Date.now(), rows: data.rows.length });
        if (stale) refreshSoon(); // a step arrived while this was read: read again, in turn
      })
      .catch(error => {
        if (error.name === "AbortError") return;
        controller = null;
        section.removeAttribute("aria-busy");
        if (stale) refreshSoon();
      });
  }

  // A live step: read the page again, but never more than once every REFRESH_MS, and not while the tab is hidden.
  function refreshSoon() {
    stale = true;
    if (timer || controller || document.hidden) return;
    const wait = Math.max(0, lastFetchAt + REFRESH_MS - Date.now());
    timer = setTimeout(() => { timer = null; if (stale && !document.hidden) load(); }, wait);
  }
  document.addEventListener("visibilitychange", () => { if (!document.hidden && stale) refreshSoon(); });
  root.addEventListener("studio:step", e => {
    section.hidden = false;
    if (e.detail.domains > 0) refreshSoon();
  });

  function number(value, digits, signed) {
    if (value === null || value === undefined) return "—";
    return (signed && value > 0 ? "+" : "") + value.toFixed(digits);
  }

  // A row's bucket means as a line, drawn in SVG: no chart library per row.
  const SVG = "http://www.w3.org/2000/svg";
  function sparkline(cells, low, high) {
    const width = 120, height = 22, span = high - low || 1;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "sparkline");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const step = cells.length > 1 ? width / (cells.length - 1) : width;
    const points = [];
    cells.forEach((value, i) => {
      if (value !== null) points.push([i * step, height - 2 - ((value - low) / span) * (height - 4)]);
    });
    if (points.length) {
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", points.map(p => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" "));
      const end = document.createElementNS(SVG, "circle");
      end.setAttribute("cx", points[points.length - 1][0].toFixed(1));
      end.setAttribute("cy", points[points.length - 1][1].toFixed(1));
      end.setAttribute("r", "1.8");
      svg.append(line, end);
    }
    return svg;
  }

  function range(rows) {
    let low = 0, high = 1;
    for (const row of rows) for (const v of row.cells) if (v !== null) { low = Math.min(low, v); high = Math.max(high, v); }
    return [low, high];
  }

  function cell(text, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    td.textContent = text;
    return td;
  }

  function renderTable(data) {
    const [low, high] = range(data.rows);
    evalHeader.hidden = !data.evaluated;
    const rows = data.rows.map(row => {
      const tr = document.createElement("tr");
      tr.dataset.domain = row.domain;
      tr.dataset.category = row.category;
      const name = document.createElement("td");
      const link = document.createElement("a");
      link.href = urls.trajectories + "&domain=" + encodeURIComponent(row.domain);
      link.textContent = row.domain;
      link.title = "this run's trajectories of " + row.domain;
      name.append(link);
      const change = cell(number(row.change, 3, true), "num");
      if (row.change) change.classList.add(row.change > 0 ? "up" : "down");
      const spark = document.createElement("td");
      spark.append(sparkline(row.cells, low, high));
      tr.append(name, cell(row.category, "muted"), cell(number(row.reward, 3), "num"), change,
                cell(row.trajectories === null ? "—" : row.trajectories.toLocaleString(), "num"), spark);
      if (data.evaluated) {
        tr.append(cell(row.evaluation ? number(row.evaluation[0], 2) + " → " + number(row.evaluation[1], 2) : "—", "num"));
      }
      return tr;
    });
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = cell(data.domains ? "No domain matches." : "No domain has a reward yet.", "muted");
      td.colSpan = 7;
      tr.append(td);
      rows.push(tr);
    }
    body.replaceChildren(...rows);
    pageLabel.textContent = `page ${data.page} of ${data.pages} · ${data.total.toLocaleString()} of ${data.domains.toLocaleString()} domains`;
    section.querySelector("[data-domain-count]").textContent = data.domains.toLocaleString() + " domain" + (data.domains === 1 ? "" : "s");
    section.querySelector("[data-page=first]").disabled = section.querySelector("[data-page=previous]").disabled = data.page <= 1;
    section.querySelector("[data-page=next]").disabled = data.page >= data.pages;
    section.querySelector("[data-domain-bucket]").textContent =
      data.bucket > 1 ? `each column and sparkline point: the mean over ${data.bucket} steps` : "";
    state.page = data.page; // a page past the end comes back as the last one
    section.querySelectorAll("th[data-sort]").forEach(th => {
      th.setAttribute("aria-sort", th.dataset.sort === data.sort ? (data.descending ? "descending" : "ascending") : "none");
    });
  }

  function renderHeatmap(data) {
    const byCategory = state.rows === "categories";
    const rows = byCategory ? data.groups : data.rows;
    const [low, high] = range(rows);
    const trace = Object.assign({}, template.data[0], {
      x: data.steps,
      y: rows.map(r => byCategory ? `${r.category} (${r.domains})` : r.domain),
      z: rows.map(r => r.cells), zmin: low, zmax: high,
    });
    const layout = Object.assign({}, template.layout, {
      height: Math.max(220, Math.min(1800, 90 + 16 * rows.length)),
      title: Object.assign({}, template.layout.title, {
        text: byCategory ? "Reward by category and step (each domain of the category weighs the same)"
          : "Reward by domain and step: the table's page",
      }),
    });
    heatmap.hidden = !rows.length;
    if (!rows.length) return;
    if (drawn) Plotly.react(heatmap, [trace], layout);
    else { Plotly.newPlot(heatmap, [trace], layout, { displaylogo: false, responsive: true }); drawn = true; }
  }

  function render(data) {
    renderTable(data);
    renderHeatmap(data);
  }

  // The controls: each asks again at once, from the first page (a page is the user's, not the clock's).
  let searchTimer = null;
  search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { state.q = search.value.trim(); state.page = 1; load(); }, SEARCH_DELAY_MS);
  });
  category.addEventListener("change", () => { state.category = category.value; state.page = 1; load(); });
  perPage.addEventListener("change", () => { state.per_page = parseInt(perPage.value, 10); state.page = 1; load(); });
  heatmapRows.addEventListener("change", () => { state.rows = heatmapRows.value; if (view.last) renderHeatmap(view.last); });
  section.querySelectorAll("th[data-sort]").forEach(th => {
    th.tabIndex = 0;
    const sort = () => {
      const key = th.dataset.sort;
      if (state.sort === key) state.order = state.order === "asc" ? "desc" : "asc";
      else { state.sort = key; state.order = key === "domain" || key === "category" ? "asc" : "desc"; }
      state.page = 1;
      load();
    };
    th.addEventListener("click", sort);
    th.addEventListener("keydown", e => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); } });
  });
  section.querySelectorAll("[data-page]").forEach(button => button.addEventListener("click", () => {
    const last = view.last ? view.last.pages : 1;
    state.page = { first: 1, previous: Math.max(1, state.page - 1), next: Math.min(last, state.page + 1) }[button.dataset.page];
    load();
  }));

  // `rows` is the heatmap's own (the server sends both the page's rows and the category means); not a query.
  Object.defineProperty(state, "rows", { value: "domains", writable: true, enumerable: false });
  if (!section.hidden) load();
})();

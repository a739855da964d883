// The run form (apps/runs/launch.py): each kind of run shows only its own settings. Every setting carries the kinds
// that have it (data-kinds); choosing a kind shows its settings and hides the others', whose inputs are disabled too
// so the browser does not post them. A setting the studio sets (data-studio) stays disabled either way.
(function () {
  "use strict";
  const form = document.querySelector("[data-run-form]");
  if (!form) return;
  const kind = form.querySelector("select[name=kind]");

  function showKind() {
    form.querySelectorAll("fieldset[data-group]").forEach(group => {
      let any = false;
      group.querySelectorAll("[data-setting][data-kinds]").forEach(setting => {
        const shown = setting.dataset.kinds.split(" ").includes(kind.value);
        setting.hidden = !shown;
        if (!("studio" in setting.dataset)) {
          setting.querySelectorAll("input, select, textarea").forEach(input => { input.disabled = !shown; });
        }
        any = any || shown;
      });
      group.hidden = !any;
    });
  }

  kind.addEventListener("change", () => { showKind(); showEditor(); });

  // Weights and quotas by category and by domain (templates/runs/_mix_editor.html): the bundle's categories, and its
  // domains a page at a time (searched on the server), each with inputs that write the JSON of category_weights,
  // category_quotas, domain_weights and domain_quotas. Those text fields stay what the form posts; typing in them
  // shows in the editor.
  const editor = form.querySelector("[data-mix-editor]");
  if (!editor) return;
  const bundle = form.querySelector("select[name=bundle]");
  const fields = {};
  for (const name of ["category_weights", "category_quotas", "domain_weights", "domain_quotas"]) {
    fields[name] = form.querySelector(`input[name=${name}]`);
  }
  const mix = { state: { q: "", category: "", page: 1 }, loaded: 0 };
  window.studioMix = mix;

  function read(name) {
    try {
      const value = JSON.parse(fields[name].value || "{}");
      return value && typeof value === "object" && !Array.isArray(value) ? value : null;
    } catch (e) { return null; }
  }
  function write(name, key, text) {
    const value = read(name);
    if (value === null) return; // the field holds something else: the form's own check will say what
    const number = parseFloat(text);
    if (text.trim() === "" || Number.isNaN(number)) delete value[key]; else value[key] = number;
    const sorted = Object.fromEntries(Object.keys(value).sort().map(k => [k, value[k]]));
    fields[name].value = JSON.stringify(sorted);
  }
  function input(name, key, attrs) {
    const box = document.createElement("input");
    box.type = "number";
    box.step = "any";
    box.min = "0";
    if (attrs.max) box.max = attrs.max;
    box.placeholder = attrs.placeholder;
    box.dataset.mix = name;
    box.dataset.key = key;
    box.setAttribute("aria-label", `${name.replace("_", " ")} of ${key}`);
    const current = (read(name) || {})[key];
    box.value = current === undefined ? "" : current;
    box.addEventListener("input", () => write(name, key, box.value));
    return box;
  }
  function cell(child) {
    const td = document.createElement("td");
    if (typeof child === "string") td.textContent = child; else td.append(child);
    return td;
  }
  // Typed into the JSON fields: the editor's inputs follow.
  Object.keys(fields).forEach(name => fields[name] && fields[name].addEventListener("input", () => {
    editor.querySelectorAll(`input[data-mix=${name}]`).forEach(box => {
      const current = (read(name) || {})[box.dataset.key];
      box.value = current === undefined ? "" : current;
    });
  }));

  let controller = null, shownBundle = null;
  function load() {
    if (!bundle.value) { editor.hidden = true; return; }
    if (controller) controller.abort();
    controller = new AbortController();
    const params = new URLSearchParams({ bundle: bundle.value, q: mix.state.q, category: mix.state.category,
                                         page: mix.state.page, per_page: 25 });
    fetch(editor.dataset.url + "?" + params, { credentials: "same-origin", signal: controller.signal })
      .then(r => { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(data => { controller = null; render(data); mix.loaded += 1; })
      .catch(() => {});
  }
  function render(data) {
    if (shownBundle !== bundle.value) { // the categories are the bundle's: drawn again only when it changes
      shownBundle = bundle.value;
      const rows = data.categories.filter(([name]) => name !== "(none)").map(([name, n]) => {
        const tr = document.createElement("tr");
        tr.dataset.category = name;
        tr.append(cell(name), cell(String(n)), cell(input("category_weights", name, { placeholder: "1" })),
                  cell(input("category_quotas", name, { placeholder: "none", max: "1" })));
        return tr;
      });
      editor.querySelector("[data-mix-categories] tbody").replaceChildren(...rows);
      editor.querySelector("[data-mix-categories]").hidden = !rows.length;
      const select = editor.querySelector("[data-mix-category]");
      select.replaceChildren(select.options[0], ...data.categories.map(([name, n]) => new Option(`${name} (${n})`, name)));
    }
    const rows = data.domains.map(d => {
      const tr = document.createElement("tr");
      tr.dataset.domain = d.domain;
      tr.append(cell(d.domain), cell(d.category), cell(String(d.weight)),
                cell(input("domain_weights", d.domain, { placeholder: String(d.weight) })),
                cell(input("domain_quotas", d.domain, { placeholder: "none", max: "1" })));
      return tr;
    });
    editor.querySelector("[data-mix-domains] tbody").replaceChildren(...rows);
    editor.querySelector("[data-mix-page-label]").textContent =
      `page ${data.page} of ${data.pages} · ${data.total} of ${data.domains_total} domains`;
    editor.querySelector("[data-mix-page=previous]").disabled = data.page <= 1;
    editor.querySelector("[data-mix-page=next]").disabled = data.page >= data.pages;
    mix.state.page = data.page;
    mix.pages = data.pages;
    showEditor();
  }
  function showEditor() {
    const weights = form.querySelector("[data-setting=domain_weights]");
    editor.hidden = !bundle.value || !weights || weights.hidden;
  }
  let searchTimer = null;
  editor.querySelector("[data-mix-search]").addEventListener("input", e => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { mix.state.q = e.target.value.trim(); mix.state.page = 1; load(); }, 250);
  });
  editor.querySelector("[data-mix-category]").addEventListener("change", e => {
    mix.state.category = e.target.value; mix.state.page = 1; load();
  });
  editor.querySelectorAll("[data-mix-page]").forEach(button => button.addEventListener("click", () => {
    mix.state.page = Math.max(1, Math.min(mix.pages || 1, mix.state.page + (button.dataset.mixPage === "next" ? 1 : -1)));
    load();
  }));
  bundle.addEventListener("change", () => { mix.state = { q: "", category: "", page: 1 }; load(); });
  load();
})();

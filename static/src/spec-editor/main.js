// The spec editor: CodeMirror 6 over a form's <textarea data-spec-editor>, which it keeps in step so the form
// posts what was typed (without JavaScript the textarea is the editor). It reads the kind's JSON Schema from
// /api/v1/schemas/<kind> for completion (Ctrl-Space) and hover documentation, and asks the studio to validate
// the text as a publish would (data-validate-url), putting each error at its field's line.
//
// Built with `make editor` into static/vendor/spec-editor.js (vendored: the studio never loads from a CDN).
// Completion and hover are ours rather than codemirror-json-schema's: that package bundles shiki (megabytes
// of grammars) for its hover text, and a spec's schema needs only key paths resolved through $ref and
// discriminated unions, below.

import {EditorView, basicSetup} from "codemirror";
import {yaml} from "@codemirror/lang-yaml";
import {autocompletion} from "@codemirror/autocomplete";
import {linter, lintGutter, forceLinting} from "@codemirror/lint";
import {hoverTooltip, keymap} from "@codemirror/view";
import {indentWithTab} from "@codemirror/commands";

// --- the YAML around a position, read by indentation (it works on text that does not parse yet) ----------------

const KEY_LINE = /^(\s*)(- +)?([A-Za-z_][\w-]*)\s*:(?:\s|$)(.*)$/;

function lineInfo(text) {
  const match = KEY_LINE.exec(text);
  const indent = text.length - text.trimStart().length;
  const blank = text.trim() === "" || text.trim().startsWith("#");
  const dash = /^\s*- /.test(text) || /^\s*-$/.test(text);
  if (!match) return {indent, blank, dash, key: null, keyIndent: dash ? indent + 2 : indent, value: ""};
  return {indent, blank, dash: Boolean(match[2]), key: match[3],
          keyIndent: match[1].length + (match[2] ? match[2].length : 0), value: match[4].replace(/\s#.*$/, "").trim()};
}

// The keys (and their scalar values) of the mapping whose keys sit at `keyIndent`, around line `at`.
function siblings(lines, at, keyIndent) {
  const found = {};
  const take = (info) => { if (info.key && info.keyIndent === keyIndent) found[info.key] = info.value; };
  for (let i = at; i >= 0; i--) {
    const info = lineInfo(lines[i]);
    if (info.blank) continue;
    if (info.keyIndent < keyIndent && !(info.dash && info.indent + 2 === keyIndent)) break;
    take(info);
    if (info.dash && info.indent + 2 === keyIndent) break;  // the first key of this list item
  }
  for (let i = at + 1; i < lines.length; i++) {
    const info = lineInfo(lines[i]);
    if (info.blank) continue;
    if (info.keyIndent < keyIndent || (info.dash && info.indent + 2 === keyIndent)) break;
    take(info);
  }
  return found;
}

// The path from the document's root to the mapping whose keys sit at `keyIndent` at line `at`: a list of steps,
// {key, mapping} (the key, with the keys of the mapping it is in) or {item: true}.
function pathTo(lines, at, keyIndent) {
  let start = at, itemAt = null;
  for (let i = at; i >= 0; i--) {
    const info = lineInfo(lines[i]);
    if (info.blank) continue;
    if (info.dash && info.indent + 2 === keyIndent) { itemAt = i; start = i; break; }
    if (info.keyIndent < keyIndent) break;
    start = i;
  }
  if (itemAt !== null) {
    const dashIndent = keyIndent - 2;
    for (let i = itemAt - 1; i >= 0; i--) {
      const info = lineInfo(lines[i]);
      if (info.blank || (info.dash && info.indent === dashIndent) || info.keyIndent > dashIndent) continue;
      if (!info.key) return null;
      return [...pathTo(lines, i, info.keyIndent) || [], {key: info.key, mapping: siblings(lines, i, info.keyIndent)},
              {item: true}];
    }
    return null;
  }
  for (let i = start - 1; i >= 0; i--) {
    const info = lineInfo(lines[i]);
    if (info.blank) continue;
    if (info.keyIndent < keyIndent) {
      if (!info.key) return null;
      return [...pathTo(lines, i, info.keyIndent) || [], {key: info.key, mapping: siblings(lines, i, info.keyIndent)}];
    }
  }
  return [];
}

// --- the JSON Schema along a path ------------------------------------------------------------------------------

function deref(schema, root) {
  let guard = 0;
  while (schema && schema.$ref && guard++ < 32) {
    const target = (root.$defs || {})[schema.$ref.split("/").pop()] || {};
    const {$ref, ...rest} = schema;
    schema = {...target, ...rest};
  }
  return schema || {};
}

function branches(schema, root) {
  schema = deref(schema, root);
  const alternatives = schema.oneOf || schema.anyOf;
  if (!alternatives) return [schema];
  return alternatives.flatMap((s) => branches(s, root)).filter((s) => s.type !== "null")
    .map((s) => ({description: schema.description, ...s}));
}

// The object alternatives a mapping can be; a discriminated union is narrowed by the tag written in it.
function objects(schema, root, mapping) {
  const all = branches(schema, root).filter((s) => s.properties);
  const narrowed = all.filter((s) => Object.entries(s.properties).every(([name, p]) => {
    const value = mapping && mapping[name];
    const constant = deref(p, root).const;
    return constant === undefined || !value || String(constant) === value.replace(/^["']|["']$/g, "");
  }));
  return narrowed.length ? narrowed : all;
}

function walk(root, path, lastMapping) {
  let schema = root;
  for (const step of path) {
    if (step.item) {
      const lists = branches(schema, root).filter((s) => s.items || s.prefixItems);
      if (!lists.length) return null;
      // Which item the cursor is in is not known here: a list with prefixItems offers all of its item shapes.
      const list = lists[0];
      schema = list.prefixItems ? {oneOf: [...list.prefixItems, list.items].filter(Boolean)} : list.items;
    } else {
      const owner = objects(schema, root, step.mapping).find((s) => s.properties[step.key]);
      if (!owner) return null;
      schema = owner.properties[step.key];
    }
  }
  return {schema, objects: objects(schema, root, lastMapping)};
}

function describe(property, root) {
  const alternatives = branches(property, root);
  const s = {...alternatives[0], ...deref(property, root)};
  const types = [...new Set(alternatives.map((b) => b.const !== undefined ? JSON.stringify(b.const)
    : b.enum ? b.enum.map((v) => JSON.stringify(v)).join(" | ") : b.type || (b.properties ? "object" : "any")))];
  const facts = [];
  if (s.default !== undefined) facts.push(`default ${JSON.stringify(s.default)}`);
  for (const [word, name] of [["at least", "minimum"], ["above", "exclusiveMinimum"], ["at most", "maximum"],
                              ["below", "exclusiveMaximum"], ["at least", "minItems"], ["at least", "minLength"]]) {
    if (s[name] !== undefined) facts.push(`${word} ${s[name]}${name.startsWith("min") && name !== "minimum" ? (name === "minItems" ? " item(s)" : " character(s)") : ""}`);
  }
  if (s.pattern) facts.push(`pattern ${s.pattern}`);
  return {type: types.join(" | "), description: s.description || "", facts};
}

// --- the editor ------------------------------------------------------------------------------------------------

function schemaLoader(urlFor) {
  const cache = {};
  return (kind) => (cache[kind] ||= fetch(urlFor(kind), {credentials: "same-origin"})
    .then((r) => (r.ok ? r.json() : null)).catch(() => null));
}

// Fields whose value names another definition, and that definition's kind.
const REFERENCE_FIELDS = {verifier: "verifier", sandbox_image: "sandbox_image", template: "task_template"};

// The project's definitions by kind, as the page lists them (<script type="application/json" id="spec-definitions">).
function definitions() {
  const element = document.getElementById("spec-definitions");
  try { return element ? JSON.parse(element.textContent) : {}; } catch (error) { return {}; }
}

function completionSource(currentSchema) {
  return async (context) => {
    const root = await currentSchema();
    if (!root) return null;
    const doc = context.state.doc;
    const line = doc.lineAt(context.pos);
    const before = line.text.slice(0, context.pos - line.from);
    const lines = doc.toString().split("\n");
    const keyTyping = /^(\s*)(- +)?([A-Za-z_][\w-]*)?$/.exec(before);
    const valueTyping = /^(\s*)(- +)?([A-Za-z_][\w-]*):\s+(\S*)$/.exec(before);
    const memberTyping = /^(\s*)- +([\w/@.-]*)$/.exec(before);
    if (memberTyping) {
      const path = pathTo(lines, line.number - 1, memberTyping[1].length + 2);  // [..., {key}, {item}]
      const owner = path && path.length > 1 ? path[path.length - 2] : null;
      if (owner && owner.key === "members") {  // a bundle's members: kind/slug@latest
        const all = definitions();
        const options = Object.entries(all).filter(([kind]) => kind === "domain" || kind === "bundle")
          .flatMap(([kind, slugs]) => slugs.map((slug) => ({label: `${kind}/${slug}@latest`, type: "variable"})));
        if (options.length) return {from: context.pos - memberTyping[2].length, options, validFor: /^[\w/@.-]*$/};
      }
    }
    if (keyTyping) {
      const keyIndent = keyTyping[1].length + (keyTyping[2] ? keyTyping[2].length : 0);
      const path = pathTo(lines, line.number - 1, keyIndent);
      if (!path) return null;
      const mapping = siblings(lines, line.number - 1, keyIndent);
      const found = walk(root, path, mapping);
      if (!found) return null;
      const taken = new Set(Object.keys(mapping));
      const options = [];
      const seen = new Set();
      for (const object of found.objects) {
        const required = new Set(object.required || []);
        for (const [name, property] of Object.entries(object.properties)) {
          if (taken.has(name) || seen.has(name)) continue;
          seen.add(name);
          const info = describe(property, root);
          options.push({label: name, type: "property", detail: info.type, info: info.description || undefined,
                        apply: `${name}: `, boost: required.has(name) ? 1 : 0});
        }
      }
      const from = context.pos - (keyTyping[3] || "").length;
      return options.length ? {from, options, validFor: /^[\w-]*$/} : null;
    }
    if (valueTyping && REFERENCE_FIELDS[valueTyping[3]]) {
      // A reference to another definition: the project's definitions of that kind (from the page).
      const slugs = definitions()[REFERENCE_FIELDS[valueTyping[3]]] || [];
      if (slugs.length) {
        return {from: context.pos - valueTyping[4].length, validFor: /^[\w@.-]*$/,
                options: slugs.map((slug) => ({label: slug, type: "variable", detail: REFERENCE_FIELDS[valueTyping[3]]}))};
      }
    }
    if (valueTyping) {
      const keyIndent = valueTyping[1].length + (valueTyping[2] ? valueTyping[2].length : 0);
      const path = pathTo(lines, line.number - 1, keyIndent);
      if (!path) return null;
      const mapping = siblings(lines, line.number - 1, keyIndent);
      delete mapping[valueTyping[3]];  // the tag being typed does not narrow its own union
      const found = walk(root, [...path, {key: valueTyping[3], mapping}], {});
      if (!found) return null;
      const values = new Set();
      for (const b of branches(found.schema, root)) {
        if (b.const !== undefined) values.add(String(b.const));
        (b.enum || []).forEach((v) => values.add(String(v)));
        if (b.type === "boolean") ["true", "false"].forEach((v) => values.add(v));
      }
      // A union's tag: the tags of its alternatives, read from the owning list's item schema.
      const owners = objects(walk(root, path, {})?.schema || {}, root, {}).map((o) => o.properties[valueTyping[3]])
        .filter(Boolean).map((p) => deref(p, root));
      owners.forEach((p) => { if (p.const !== undefined) values.add(String(p.const)); });
      if (!values.size) return null;
      return {from: context.pos - valueTyping[4].length, options: [...values].map((v) => ({label: v, type: "enum"})),
              validFor: /^[\w.-]*$/};
    }
    return null;
  };
}

function hoverSource(currentSchema) {
  return hoverTooltip(async (view, pos) => {
    const root = await currentSchema();
    if (!root) return null;
    const line = view.state.doc.lineAt(pos);
    const info = lineInfo(line.text);
    if (!info.key) return null;
    const start = line.from + info.keyIndent, end = start + info.key.length;
    if (pos < start || pos > end) return null;
    const lines = view.state.doc.toString().split("\n");
    const path = pathTo(lines, line.number - 1, info.keyIndent);
    if (!path) return null;
    const found = walk(root, [...path, {key: info.key, mapping: siblings(lines, line.number - 1, info.keyIndent)}], {});
    if (!found) return null;
    const facts = describe(found.schema, root);
    return {pos: start, end, above: true, create() {
      const dom = document.createElement("div");
      dom.className = "spec-hover";
      const title = document.createElement("strong");
      title.textContent = `${info.key}: ${facts.type}`;
      dom.append(title);
      for (const text of [facts.description, facts.facts.join("; ")]) {
        if (!text) continue;
        const p = document.createElement("div");
        p.textContent = text;
        dom.append(p);
      }
      return {dom};
    }};
  });
}

function validator(textarea, kindOf, slugOf) {
  const url = textarea.dataset.validateUrl;
  const csrf = textarea.form && textarea.form.querySelector("input[name=csrfmiddlewaretoken]");
  const status = document.getElementById(textarea.dataset.statusId || "");
  return linter(async (view) => {
    const body = new URLSearchParams({kind: kindOf(), slug: slugOf(), spec: view.state.doc.toString()});
    let answer;
    try {
      const response = await fetch(url, {method: "POST", body, credentials: "same-origin",
                                         headers: {"X-CSRFToken": csrf ? csrf.value : ""}});
      answer = await response.json();
    } catch (error) {
      if (status) status.textContent = "Could not check the spec just now; it is checked again on publish.";
      return [];
    }
    if (status) {
      status.textContent = answer.errors.length ? `${answer.errors.length} problem(s): publishing is refused until ` +
        "they are fixed." : "No problems: this spec publishes.";
      status.dataset.problems = String(answer.errors.length);
      if (answer.errors.length) {  // each problem in words, not only as a marker in the margin
        const list = document.createElement("ul");
        for (const e of answer.errors.slice(0, 8)) {
          const item = document.createElement("li");
          item.textContent = `${e.line ? `line ${e.line}: ` : ""}${e.field ? `${e.field}: ` : ""}${e.problem}`;
          list.append(item);
        }
        status.append(list);
      }
    }
    const doc = view.state.doc;
    return answer.errors.map((e) => {
      const line = doc.line(Math.min(Math.max(e.line || 1, 1), doc.lines));
      const from = line.from + (line.text.length - line.text.trimStart().length);
      return {from, to: Math.max(line.to, from), severity: "error",
              message: e.field ? `${e.field}: ${e.problem}` : e.problem};
    });
  }, {delay: 400});
}

function mount(textarea) {
  const kindField = document.getElementById(textarea.dataset.kindField || "");
  const slugField = document.getElementById(textarea.dataset.slugField || "");
  const kindOf = () => (kindField ? kindField.value : textarea.dataset.kind);
  const slugOf = () => (slugField ? slugField.value : textarea.dataset.slug || "");
  const load = schemaLoader((kind) => textarea.dataset.schemaUrl.replace("KIND", kind));
  const currentSchema = () => load(kindOf());
  const wrapper = document.createElement("div");
  wrapper.className = "spec-editor";
  textarea.after(wrapper);
  textarea.hidden = true;
  const label = document.querySelector(`label[for="${textarea.id}"]`);
  const view = new EditorView({
    doc: textarea.value,
    parent: wrapper,
    extensions: [
      basicSetup, yaml(),
      // Tab indents; Escape then Tab leaves the editor (CodeMirror's rule), so the keyboard alone gets out.
      keymap.of([indentWithTab]),
      autocompletion({override: [completionSource(currentSchema)], activateOnTyping: true}),
      hoverSource(currentSchema), validator(textarea, kindOf, slugOf), lintGutter(),
      EditorView.updateListener.of((update) => { if (update.docChanged) textarea.value = update.state.doc.toString(); }),
      EditorView.contentAttributes.of({"aria-label": label ? label.textContent.replace(/:$/, "") : "Spec (YAML)"}),
    ],
  });
  if (label) label.addEventListener("click", () => view.focus());
  for (const field of [kindField, slugField]) if (field) field.addEventListener("change", () => forceLinting(view));
  textarea.specEditor = view;
  return view;
}

function mountAll() {
  document.querySelectorAll("textarea[data-spec-editor]").forEach((t) => { if (!t.specEditor) mount(t); });
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", mountAll);
else mountAll();

window.SpecEditor = {mount, pathTo, siblings};

// Review page, keyboard first. A mark (the outlined box with "▸") sits on one question or on the summary of the
// answers at the end of the form, and the hint line under the heading says, for where the mark is, what each key
// will do. 1-9 answer the marked question (pass/fail: 1 pass, 2 fail), then the mark moves to the next question
// not yet answered, or to the summary when none is left after it: it never wraps back onto an answered question,
// so keys typed ahead never overwrite an answer. Tab and Shift+Tab move the mark one stop on or back (Tab from
// the last question reaches the summary; nothing wraps). Enter on a question moves the mark to the summary; Enter
// on the summary submits (or, with a required question unanswered, marks it); Esc goes back from the summary to
// the first question not answered. s skips the item; t opens the form for the turn the replay is on (j/k move
// between turns, replay.js). Keys typed into a text box are left alone. The answers being given are kept in
// sessionStorage until the item's label is submitted, so labelling a turn (a page load) does not lose them.
//
// On the queue page, the export form's accepted answers are narrowed to those of the chosen question.
(function () {
  "use strict";
  const form = document.querySelector("[data-label-form]");
  const stepForm = document.querySelector("[data-step-form]");
  const hint = document.querySelector("[data-keys-hint]");
  const summary = form && form.querySelector("[data-summary]");
  const fieldsets = form ? Array.from(form.querySelectorAll(".question")) : [];
  const questions = fieldsets.filter(q => q.dataset.type !== "text");
  const stops = summary ? [...questions, summary] : [];
  const atSummary = () => stops[mark] === summary;
  const amending = form && form.dataset.amendRevision;
  let mark = 0;

  const named = q => "“" + q.dataset.prompt + "”";
  const options = q => Array.from(q.querySelectorAll("input[type=radio]"));

  function answer(q) {
    if (q.dataset.type === "text") return q.querySelector("textarea").value.trim();
    const checked = q.querySelector("input[type=radio]:checked");
    return checked ? checked.dataset.text : "";
  }

  const missing = () => fieldsets.filter(q => q.dataset.required === "true" && answer(q) === "");

  function after(index) {
    // The next question after `index` not yet answered, else the summary: answered ones are passed over.
    for (let i = index + 1; i < questions.length; i++) {
      if (answer(questions[i]) === "") return i;
    }
    return questions.length;
  }

  function where(index) {
    return index < questions.length ? named(questions[index]) : "your answers";
  }

  function key(name, what) {
    const part = document.createElement("span");
    const kbd = document.createElement("kbd");
    kbd.textContent = name;
    part.append(kbd, what);
    return part;
  }

  function renderSummary() {
    const list = summary.querySelector("[data-summary-list]");
    list.replaceChildren(...fieldsets.map(q => {
      const item = document.createElement("li");
      const given = answer(q);
      const prompt = document.createElement("span");
      const value = document.createElement("b");
      prompt.textContent = q.dataset.prompt;
      value.textContent = given === "" ? "not answered" : given;
      item.append(prompt, " ", value);
      if (given === "" && q.dataset.required === "true") {
        item.classList.add("error");
        item.append(" (required)");
      }
      return item;
    }));
  }

  function renderHint() {
    if (!hint) return;
    const parts = [];
    if (atSummary()) {
      const open = missing();
      parts.push(key("Enter", open.length
        ? `: the mark moves to ${named(open[0])} (required, not answered)`
        : `: submit these answers${amending ? " as revision " + amending : ""}`));
      parts.push(key("Esc", ": back to the questions"));
      if (questions.length) parts.push(key("Shift+Tab", `: back to ${where(questions.length - 1)}`));
      parts.push(key("1–9", ": nothing (the mark is on your answers, not on a question)"));
    } else {
      const q = questions[mark];
      const count = options(q).length;
      const passFail = q.dataset.type === "pass_fail" ? " (1 pass, 2 fail)" : "";
      parts.push(key(`1–${count}`, ` answer ${named(q)}${passFail}, then the mark moves to ${where(after(mark))}`));
      parts.push(key("Tab", `: the mark moves to ${where(mark + 1)}`));
      if (mark > 0) parts.push(key("Shift+Tab", `: back to ${where(mark - 1)}`));
      parts.push(key("Enter", ": check your answers before submitting"));
    }
    if (form.querySelector("[data-skip]")) parts.push(key("s", ": skip this item"));
    parts.push(key("j/k", ": next/previous turn"));
    if (stepForm) parts.push(key("t", ": label the turn the replay is on"));
    hint.replaceChildren(...parts.flatMap((part, i) => (i ? [" · ", part] : [part])));
  }

  function place(index) {
    if (!stops.length) return;
    mark = Math.max(0, Math.min(index, stops.length - 1));
    stops.forEach((stop, i) => {
      stop.classList.toggle("active", i === mark);
      if (i === mark) stop.setAttribute("aria-current", "step");
      else stop.removeAttribute("aria-current");
    });
    renderSummary();
    renderHint();
    stops[mark].scrollIntoView({block: "nearest"});  // the summary sits below the fold on a long rubric
  }

  function typing(target) {
    return target && (target.tagName === "TEXTAREA" || target.tagName === "SELECT"
      || (target.tagName === "INPUT" && target.type === "text"));
  }

  document.addEventListener("keydown", event => {
    if (!form || event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    if (/^[1-9]$/.test(event.key) && !atSummary() && questions.length) {
      const option = options(questions[mark])[Number(event.key) - 1];
      if (option) {
        option.checked = true;
        option.dispatchEvent(new Event("change", {bubbles: true}));
        place(after(mark));
        event.preventDefault();
      }
    } else if (event.key === "Tab" && stops.length) {
      place(mark + (event.shiftKey ? -1 : 1));
      event.preventDefault();
    } else if (event.key === "Escape" && atSummary()) {
      const open = questions.findIndex(q => answer(q) === "");
      place(open === -1 ? 0 : open);
      event.preventDefault();
    } else if (event.key === "Enter") {
      if (event.target.tagName === "BUTTON" || event.target.tagName === "A") return;
      event.preventDefault();
      if (!atSummary()) {
        place(questions.length);
        return;
      }
      const open = missing();
      if (!open.length) form.requestSubmit(form.querySelector("[data-submit]"));
      else if (questions.includes(open[0])) place(questions.indexOf(open[0]));
      else open[0].querySelector("textarea").focus();
    } else if (event.key === "s" && form.querySelector("[data-skip]")) {
      event.preventDefault();
      form.requestSubmit(form.querySelector("[data-skip]"));
    } else if (event.key === "t" && stepForm) {
      const turn = document.body.dataset.currentTurn || "0";
      stepForm.hidden = false;
      stepForm.querySelector("[data-step-input]").value = turn;
      stepForm.querySelector("[data-step-label]").textContent = turn;
      event.preventDefault();
    }
  });

  const draftKey = "review-draft:" + location.pathname;

  function saveDraft() {
    if (!form) return;
    const fields = {};
    for (const [name, value] of new FormData(form)) {
      if (name.startsWith("a-") || name === "comment") fields[name] = value;
    }
    sessionStorage.setItem(draftKey, JSON.stringify(fields));
  }

  function restoreDraft() {
    const saved = form && sessionStorage.getItem(draftKey);
    if (!saved) return;
    for (const [name, value] of Object.entries(JSON.parse(saved))) {
      for (const field of form.querySelectorAll(`[name="${CSS.escape(name)}"]`)) {
        if (field.type === "radio") field.checked = field.value === value;
        else field.value = value;
      }
    }
  }

  if (form) {
    form.addEventListener("change", saveDraft);
    form.addEventListener("input", () => {
      saveDraft();
      renderSummary();
      renderHint();
    });
    form.addEventListener("submit", () => sessionStorage.removeItem(draftKey));
    // A click marks the question it answers, so the mark is always where the last answer was given.
    form.addEventListener("click", event => {
      const stop = event.target.closest("[data-stop]");
      if (stop && stops.includes(stop) && event.target.matches("input[type=radio], legend, fieldset")) {
        place(stops.indexOf(stop));
      }
    });
    document.addEventListener("keyup", saveDraft);
    restoreDraft();
    // Amending: the mark starts on the first question; labelling: on the first question not answered.
    place(amending ? 0 : after(-1));
  }

  const exportForm = document.querySelector("[data-export]");
  if (exportForm) {
    const question = exportForm.querySelector("select[name=question]");
    const accept = exportForm.querySelector("select[name=accept]");
    const narrow = () => {
      for (const group of accept.querySelectorAll("optgroup")) {
        group.hidden = group.dataset.question !== question.value;
        group.disabled = group.hidden;
      }
      const chosen = accept.selectedOptions[0];
      if (!chosen || chosen.parentElement.disabled) {
        const first = accept.querySelector(`optgroup[data-question="${CSS.escape(question.value)}"] option`);
        if (first) first.selected = true;
      }
    };
    question.addEventListener("change", narrow);
    narrow();
  }
})();

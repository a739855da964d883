// Review page, keyboard first: 1-9 answer the highlighted question (pass/fail: 1 pass, 2 fail) and move on to
// the next; Tab and Shift+Tab move between questions; Enter submits; s skips the item; t opens the form for the
// turn the replay is on (j/k move between turns, replay.js). Keys typed into a text box are left alone. The
// answers being given are kept in sessionStorage until the item's label is submitted, so labelling a turn
// (a page load) does not lose them.
(function () {
  "use strict";
  const form = document.querySelector("[data-label-form]");
  const stepForm = document.querySelector("[data-step-form]");
  const questions = form ? Array.from(form.querySelectorAll(".question")).filter(q => q.dataset.type !== "text") : [];
  let active = 0;

  function highlight(index) {
    if (!questions.length) return;
    active = (index + questions.length) % questions.length;
    questions.forEach((q, i) => q.classList.toggle("active", i === active));
  }

  function typing(target) {
    return target && (target.tagName === "TEXTAREA" || (target.tagName === "INPUT" && target.type === "text"));
  }

  document.addEventListener("keydown", event => {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    if (/^[1-9]$/.test(event.key) && questions.length) {
      const options = questions[active].querySelectorAll("input[type=radio]");
      const option = options[Number(event.key) - 1];
      if (option) {
        option.checked = true;
        highlight(active + 1);
        event.preventDefault();
      }
    } else if (event.key === "Tab" && questions.length) {
      highlight(active + (event.shiftKey ? -1 : 1));
      event.preventDefault();
    } else if (event.key === "Enter" && form) {
      event.preventDefault();
      form.requestSubmit(form.querySelector("[data-submit]"));
    } else if (event.key === "s" && form) {
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
    form.addEventListener("input", saveDraft);
    form.addEventListener("submit", () => sessionStorage.removeItem(draftKey));
    document.addEventListener("keyup", saveDraft);
  }
  restoreDraft();
  highlight(0);
})();

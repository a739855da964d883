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

  kind.addEventListener("change", showKind);
})();

// Small conveniences only: every page works without this file.
document.addEventListener("DOMContentLoaded", function () {
  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll('input[name="ids"]').forEach(function (box) { box.checked = all.checked; });
    });
  }
  document.querySelectorAll("[data-confirm]").forEach(function (button) {
    button.addEventListener("click", function (event) {
      if (!window.confirm(button.getAttribute("data-confirm"))) { event.preventDefault(); }
    });
  });
});

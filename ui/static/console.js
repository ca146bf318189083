// The console works without this file: it adds a "select all" box to lists of selectable events.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("form.selection table").forEach(function (table) {
    var boxes = table.querySelectorAll("tbody input[type=checkbox][name=ids]");
    var head = table.querySelector("thead th");
    if (!boxes.length || !head) return;
    var all = document.createElement("input");
    all.type = "checkbox";
    all.setAttribute("aria-label", "Select every event of this page");
    all.addEventListener("change", function () {
      boxes.forEach(function (b) { b.checked = all.checked; });
    });
    head.appendChild(all);
  });
});

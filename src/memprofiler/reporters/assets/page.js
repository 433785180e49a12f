
document.querySelectorAll("table.filterable").forEach(function (table) {
  var box = document.createElement("input");
  box.className = "filter";
  box.placeholder = "filter rows";
  box.addEventListener("input", function () {
    var q = box.value.toLowerCase();
    table.querySelectorAll("tbody tr").forEach(function (tr) {
      tr.style.display = tr.textContent.toLowerCase().indexOf(q) >= 0 ? "" : "none";
    });
  });
  table.parentNode.insertBefore(box, table);
});


(function () {
  function reveal(id, fallback) {
    var el = document.getElementById(id) || (fallback && document.getElementById(fallback));
    if (!el) return false;
    for (var p = el; p; p = p.parentElement) if (p.tagName === "DETAILS") p.open = true;
    el.scrollIntoView({block: "center"});
    document.querySelectorAll(".pv-target").forEach(function (t) { t.classList.remove("pv-target"); });
    el.classList.add("pv-target");
    return true;
  }
  document.querySelectorAll("a.pv-link").forEach(function (a) {
    a.addEventListener("click", function (ev) {
      var id = a.getAttribute("href").slice(1);
      if (reveal(id, a.dataset.table)) { ev.preventDefault(); history.replaceState(null, "", "#" + id); }
    });
  });
  if (location.hash.length > 1) reveal(decodeURIComponent(location.hash.slice(1)));
})();

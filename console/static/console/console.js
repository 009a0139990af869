// The console's only script besides htmx: say so when an htmx request is refused or fails.
document.addEventListener("htmx:responseError", function (event) {
  var box = document.getElementById("htmx-error");
  if (!box) return;
  var xhr = event.detail.xhr;
  box.textContent = xhr.status === 403
    ? "You do not have the permission for that action."
    : "The server answered " + xhr.status + ": nothing was changed. Reload the page.";
  box.hidden = false;
});
document.addEventListener("htmx:sendError", function () {
  var box = document.getElementById("htmx-error");
  if (!box) return;
  box.textContent = "The console cannot reach the server; the page stops updating until it can.";
  box.hidden = false;
});
document.addEventListener("htmx:afterRequest", function (event) {
  var box = document.getElementById("htmx-error");
  if (box && event.detail.successful) box.hidden = true;
});
// A filter form leaves the filters a person left empty out of the URL: "?tag=finance", not
// "?q=&tag=finance&goal=&model=…", whether htmx sends it or the browser does.
document.addEventListener("htmx:configRequest", function (event) {
  if (!event.detail.elt.matches || !event.detail.elt.matches("form[data-filters]")) return;
  var data = event.detail.formData;
  Array.from(new Set(data.keys())).forEach(function (name) {
    if (data.getAll(name).every(function (value) { return value === ""; })) data.delete(name);
  });
});
document.addEventListener("submit", function (event) {
  var form = event.target;
  if (!form.matches("form[data-filters]") || form.hasAttribute("hx-get")) return;
  var emptied = Array.from(form.elements).filter(function (field) {
    return field.name && !field.disabled && field.value === "";
  });
  emptied.forEach(function (field) { field.disabled = true; });
  setTimeout(function () { emptied.forEach(function (field) { field.disabled = false; }); }, 0);
});

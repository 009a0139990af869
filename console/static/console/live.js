// The task page's live panel (issue 52): while the task runs, what its model turn is writing, as
// it is written, from the console's stream (tasks:live: Server-Sent Events, the session's person).
// Text only (textContent): a model's words are never HTML. Hidden reasoning is never sent. When
// the turn is stored, the panel empties as soon as the page shows the stored turn (its
// `#turn-N`, N from the "end" delta or the stored event), else at the next refresh begun after
// it was stored (a page showing older turns).
(function () {
  var HELD = ["in_progress", "pause_requested"];
  var panel = document.getElementById("live-turn");
  if (!panel) return;
  var source = null;
  var text = "";
  var calls = [];
  var stored = false; // the turn shown was stored: the next refresh shows it
  var storedIndex = null; // its index in the transcript (`#turn-N`), once known
  var endedIndex = -1; // the last turn whose "end" came: its stored event is old news
  var clearOnSwap = false; // a refresh asked for after it was stored

  function byId(id) { return document.getElementById(id); }

  function status() {
    var live = byId("live");
    return live ? live.getAttribute("data-status") : "";
  }

  function render() {
    byId("live-turn-text").textContent = text;
    var box = byId("live-turn-calls");
    box.textContent = "";
    calls.forEach(function (call) {
      if (!call) return;
      var row = document.createElement("div");
      row.className = "call";
      var name = document.createElement("code");
      name.className = "tool";
      name.textContent = call.name || "…";
      var args = document.createElement("pre");
      args.className = "json args";
      args.textContent = call.arguments;
      row.appendChild(name);
      row.appendChild(args);
      box.appendChild(row);
    });
    byId("live-turn-note").textContent = stored
      ? "stored: shown in the transcript at the next refresh"
      : "being written, not stored yet";
    panel.hidden = !(text || calls.length);
  }

  function forget() {
    text = "";
    calls = [];
    stored = false;
    storedIndex = null;
    clearOnSwap = false;
  }

  // The stored turn is on the page: the panel would show it twice.
  function shownStored() {
    return stored && storedIndex !== null && byId("turn-" + storedIndex) !== null;
  }

  function apply(message) {
    if (message.reset) forget();
    message.deltas.forEach(function (delta) {
      var kind = delta[0];
      var data = delta[1];
      if (kind === "turn") {
        forget();
      } else if (kind === "text") {
        text += data.text;
      } else if (kind === "tool_call") {
        var call = calls[data.index] || (calls[data.index] = { name: "", arguments: "" });
        call.name = call.name || data.name;
        call.arguments += data.arguments;
      } else if (kind === "end") {
        if (data.stored) {
          stored = true;
          if (typeof data.turn === "number") {
            storedIndex = data.turn;
            endedIndex = Math.max(endedIndex, data.turn);
          }
        } else {
          forget(); // cut off or declined: nothing of it is kept
        }
      }
    });
    if (shownStored()) forget(); // a refresh showed the stored turn before the end came
    render();
  }

  function open() {
    if (source) return;
    source = new EventSource(panel.getAttribute("data-url"));
    source.addEventListener("delta", function (event) { apply(JSON.parse(event.data)); });
    // A stored turn's event (read once a second, so it may come after the next turn began):
    // what says the turn shown was stored when its "end" did not come.
    source.addEventListener("task_event", function (event) {
      var storedEvent = JSON.parse(event.data);
      if (storedEvent.kind !== "model_turn" || !(text || calls.length)) return;
      var index = storedEvent.data && storedEvent.data.turn;
      if (typeof index === "number") {
        if (index <= endedIndex) return; // an earlier turn's, already ended
        storedIndex = index;
      }
      stored = true;
      if (shownStored()) forget(); // a refresh showed it before the event came
      render();
    });
    source.addEventListener("end", shut);
    // On a dropped connection EventSource reconnects by itself; a refusal (503) closes it, and
    // the page goes on refreshing as it did before.
  }

  function shut() {
    if (source) {
      source.close();
      source = null;
    }
  }

  function follow() {
    if (HELD.indexOf(status()) >= 0) {
      open();
    } else {
      shut();
      forget();
      render();
    }
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    if (stored && event.target && event.target.id === "live") clearOnSwap = true;
  });
  document.addEventListener("htmx:afterSettle", function () {
    if (clearOnSwap || shownStored()) {
      forget();
      render();
    }
    follow();
  });
  follow();
})();
